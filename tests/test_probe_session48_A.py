"""Session 48 (helper A) hostile and unusual input: run folders mixing two runs' files, re-summaries that dropped keys,
and outputs nested in an earlier output folder.

- A run folder whose requests.parquet was one run's and steps.parquet or summary.json another's (a copy gone wrong)
  was read as one run by analysis.summarize, analysis.compare, the report and the validation scripts, at exit 0, with
  figures of both. The run writer (analysis.runs) now writes one run id, a digest of the run's tables, into both
  tables' parquet metadata and summary.json (sim.run_id); the readers refuse a folder whose files name different
  ids, in one line naming the folder and two of its files. A folder written before run ids is read as before.
- analysis.summarize rewrote summary.json without the keys it does not write itself (a newer version's, a user's
  note): it now carries them over.
- --out RUN/sub, RUN an earlier run's folder, nested a run inside a run: RUN then held a folder no run wrote
  (sim.replay --out RUN --overwrite refused it) and the readers took RUN for one run. sim.replay, engine.replay,
  analysis.capacity and analysis.compare now refuse an --out inside any command's output folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.compare.cli import main as compare_main
from analysis.summarize import main as summarize_main
from cli.engine_replay import main as engine_replay_main
from cli.sim_replay import main as replay_main
from sim.run_id import RUN_ID_KEY, run_ids
from sim.run_kind import gpu_run_problem
from tests.traces.helpers import cli_error
from validation.step_errors import main as step_errors_main

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"


def _replay(out: Path, limit: int) -> Path:
    assert replay_main([str(SHAREGPT), "--limit", str(limit), "--out", str(out), "--no-report", "--quiet"]) == 0
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("runs")
    return _replay(root / "a", 20), _replay(root / "b", 30)


def _mixed(tmp_path: Path, requests_of: Path, steps_of: Path, summary_of: Path) -> Path:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name, source in (("requests.parquet", requests_of), ("steps.parquet", steps_of), ("summary.json", summary_of)):
        shutil.copyfile(source / name, mixed / name)
    return mixed


def test_a_run_names_one_id_in_its_three_files_and_writes_the_same_bytes_twice(two_runs, tmp_path):
    a, b = two_runs
    ids = run_ids(a)
    assert list(ids) == ["requests.parquet", "steps.parquet", "summary.json"]
    assert len(set(ids.values())) == 1 and len(ids["summary.json"]) == 16
    assert set(run_ids(b).values()) != set(ids.values())
    again = _replay(tmp_path / "again", 20)  # a random id would break this: outputs are compared across runs
    for name in ("requests.parquet", "steps.parquet"):
        assert (again / name).read_bytes() == (a / name).read_bytes()
    assert json.loads((a / "summary.json").read_text())["run_id"] == ids["summary.json"]


@pytest.mark.parametrize(("steps_from", "summary_from", "second"), [
    ("b", "a", "steps.parquet"),  # one run's requests beside another's steps
    ("a", "b", "summary.json"),  # a run's tables under another's summary
])
def test_a_folder_mixing_two_runs_is_refused_by_its_readers(two_runs, tmp_path, capsys, steps_from, summary_from,
                                                            second):
    a, b = two_runs
    runs = {"a": a, "b": b}
    mixed = _mixed(tmp_path, a, runs[steps_from], runs[summary_from])
    other = run_ids(b)["summary.json"]
    expected = (f"error: run folder {mixed} mixes the files of different runs: requests.parquet is of run "
                f"{run_ids(a)['summary.json']}, {second} of run {other}; expected one run's files (copy a run's "
                "folder whole, or rerun it)")
    before = (mixed / "summary.json").read_bytes()
    assert cli_error(summarize_main, [str(mixed)], capsys) == expected  # was a summary of both runs, at exit 0
    assert (mixed / "summary.json").read_bytes() == before
    good = tmp_path / "good"
    shutil.copytree(a, good)
    (good / "summary.json").write_text("{}\n")
    assert cli_error(summarize_main, [str(good), str(mixed)], capsys) == expected
    assert (good / "summary.json").read_text() == "{}\n"  # checked before any folder is rewritten
    assert cli_error(compare_main, [str(mixed), str(b), "--out", str(tmp_path / "cmp")], capsys) == expected
    assert not (tmp_path / "cmp").exists()
    assert gpu_run_problem(mixed) == expected.removeprefix("error: ")  # sim.calibrate, sim.host_speed, validation/
    assert cli_error(step_errors_main, [str(mixed)], capsys) == expected


def _without_run_ids(run: Path, out: Path) -> Path:
    """``run`` as a writer before run ids wrote it: no id in either table's metadata nor in summary.json."""
    out.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        table = pq.read_table(run / name)
        pq.write_table(table.replace_schema_metadata(None), out / name)
        assert RUN_ID_KEY.encode() not in (pq.read_metadata(out / name).metadata or {})
    summary = json.loads((run / "summary.json").read_text())
    del summary["run_id"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out


def test_a_folder_written_before_run_ids_is_read_as_before(two_runs, tmp_path, capsys):
    a, b = two_runs
    old = _without_run_ids(a, tmp_path / "old")
    assert run_ids(old) == {}
    assert summarize_main([str(old), "--quiet"]) == 0
    assert "run_id" not in json.loads((old / "summary.json").read_text())  # none made up for tables that name none
    assert compare_main([str(old), str(b), "--out", str(tmp_path / "cmp"), "--no-report",
                         "--allow-different-requests"]) == 0
    # A file without an id beside ones with theirs is not a disagreement: an older summary.json over a newer run's
    # tables is read, as it was.
    newer = tmp_path / "newer"
    shutil.copytree(a, newer)
    shutil.copyfile(old / "summary.json", newer / "summary.json")
    assert summarize_main([str(newer), "--quiet"]) == 0
    assert json.loads((newer / "summary.json").read_text())["run_id"] == run_ids(a)["requests.parquet"]


def test_a_resummary_keeps_the_keys_it_does_not_write(two_runs, tmp_path):
    """A newer version's key or a user's note was dropped from summary.json by analysis.summarize."""
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    summary = json.loads((run / "summary.json").read_text())
    before = dict(summary)
    summary.update(note="baseline for the 0.9 release", newer_metric_ms={"p50": 1.5})
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    assert summarize_main([str(run), "--quiet"]) == 0
    after = json.loads((run / "summary.json").read_text())
    assert list(after) == [*before, "note", "newer_metric_ms"]
    assert after["note"] == "baseline for the 0.9 release" and after["newer_metric_ms"] == {"p50": 1.5}
    assert {key: after[key] for key in before if key != "simulator_wall_s"} == {
        key: before[key] for key in before if key != "simulator_wall_s"}


def test_a_resummary_names_a_kept_key_it_cannot_write_back(two_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    text = (run / "summary.json").read_text()
    (run / "summary.json").write_text(text[:text.rindex("}")] + ', "note": {"x": [1, NaN]}}\n')
    assert cli_error(summarize_main, [str(run)], capsys) == (
        f"error: {run / 'summary.json'}: 'note.x[1]' is NaN or Infinity; expected a finite number, a string or null")


def _nested_line(option_target: Path, run: Path) -> str:
    return (f"error: --out {option_target} is inside {run}, the output folder of an earlier command (it holds "
            "requests.parquet and steps.parquet); write the output beside it, not in it")


def test_sim_replay_refuses_an_out_inside_a_run_folder(two_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run)
    for target in (run / "sub", run / "sub" / "deeper"):
        argv = [str(SHAREGPT), "--limit", "5", "--out", str(target), "--no-report", "--quiet"]
        assert cli_error(replay_main, argv, capsys) == _nested_line(target, run)
    assert sorted(p.name for p in run.iterdir()) == ["requests.parquet", "steps.parquet", "summary.json"]
    assert _replay(tmp_path / "beside", 5).is_dir()  # a folder beside it is fine
    plan = tmp_path / "plan"  # a capacity plan's folder is an output folder too
    plan.mkdir()
    (plan / "capacity.json").write_text("[]\n")
    shutil.copyfile(run / "steps.parquet", plan / "capacity.parquet")
    argv = [str(SHAREGPT), "--limit", "5", "--out", str(plan / "run"), "--no-report", "--quiet"]
    assert cli_error(replay_main, argv, capsys) == (
        f"error: --out {plan / 'run'} is inside {plan}, the output folder of an earlier command (it holds "
        "capacity.json and capacity.parquet); write the output beside it, not in it")


def test_capacity_compare_and_engine_replay_refuse_an_out_inside_a_run_folder(two_runs, tmp_path, capsys,
                                                                             monkeypatch):
    a, b = two_runs
    run = tmp_path / "run"
    shutil.copytree(a, run)
    target = run / "plan"
    argv = [str(SHAREGPT), "--slo", "ttft_p90=2s", "--out", str(target), "--quiet"]
    assert cli_error(capacity_main, argv, capsys) == _nested_line(target, run)
    # analysis.compare already refused an --out inside one of its inputs; this run is neither of them.
    assert cli_error(compare_main, [str(a), str(b), "--out", str(target)], capsys) == _nested_line(target, run)
    import engine.llm

    monkeypatch.setattr(engine.llm, "LLM", lambda *a, **k: pytest.fail("the model loaded before --out was checked"))
    argv = [str(SHAREGPT), "--limit", "2", "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu",
            "--out", str(target)]
    assert cli_error(engine_replay_main, argv, capsys) == _nested_line(target, run)
    assert not target.exists()


def test_a_folder_of_the_users_runs_is_no_run_folder(two_runs, tmp_path):
    """A folder holding runs, a summary.json and a report.html of the user's own, or one stray requests.parquet (a
    home folder's download), is not taken for a run's output: every run under it would be refused."""
    root = tmp_path / "experiments"
    root.mkdir()
    (root / "summary.json").write_text("{}\n")
    (root / "report.html").write_text("<html></html>\n")
    shutil.copyfile(two_runs[0] / "requests.parquet", root / "requests.parquet")
    assert _replay(root / "run", 5).is_dir()
    assert pl.read_parquet(root / "run" / "requests.parquet").height == 5


def test_a_polars_without_key_value_metadata_writes_the_run_without_its_id(tmp_path, monkeypatch):
    """pyproject allows polars 1.0, whose write_parquet takes no ``metadata``: the run is written, as one before run
    ids (not refused with a TypeError after the whole replay)."""
    from analysis.runs import write_run

    original = pl.DataFrame.write_parquet

    def write_parquet_10(self, file, *, compression="zstd", compression_level=None, statistics=True):
        original(self, file, compression=compression, compression_level=compression_level, statistics=statistics)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", write_parquet_10)
    source = tmp_path / "source"
    _replay(source, 5)
    monkeypatch.undo()
    assert run_ids(source) == {}
    monkeypatch.setattr(pl.DataFrame, "write_parquet", write_parquet_10)
    out = tmp_path / "run"
    summary = write_run(out, pq.read_table(source / "requests.parquet"), pq.read_table(source / "steps.parquet"),
                        {"cost_model": "measured", "trace": "t", "config": {}})
    assert "run_id" not in summary and run_ids(out) == {}
    assert pl.read_parquet(out / "requests.parquet").height == 5
