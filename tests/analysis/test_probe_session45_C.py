"""Session 45 (helper C): a run without a prefix cache reported a hit rate of 0.0 (a cache that missed, where there
was none: vLLM reports no rate then), which analysis.compare counted against the simulator; and a run killed by
SIGKILL left its hidden staging folder beside --out for good."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.compare.cli import main as compare_main
from analysis.metrics import summarize
from analysis.outdir import staged_out_dir
from analysis.summarize import main as summarize_main
from cli.sim_replay import main as sim_main
from tests.sim.helpers import SHAREGPT, make_trace, result_tables, run_cli, write_trace
from tests.traces.helpers import dead_pid
from traces.files import staging_path

NOT_COMPARED = "not compared: prefix caching off (sim)"


def _replay(trace: Path, out: Path, *options: str) -> dict:
    assert sim_main([str(trace), "--out", str(out), "--no-report", "--quiet", *options]) == 0
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """The same prefix-sharing trace replayed with and without the prefix cache."""
    folder = tmp_path_factory.mktemp("runs")
    trace = write_trace(folder / "shared.parquet", [512, 512, 512], [4, 4, 4], [0.0, 1.0, 2.0],
                        hash_ids=[[1, 2], [1, 2], [1, 2]], hash_block_size=256)
    cached, uncached = folder / "cached", folder / "uncached"
    _replay(trace, cached)
    _replay(trace, uncached, "--no-prefix-caching")
    return cached, uncached


def test_a_run_without_a_prefix_cache_has_no_hit_rate(runs) -> None:
    cached, uncached = (json.loads((run / "summary.json").read_text()) for run in runs)
    # The two later prompts find their first block cached (the last is computed again, as vLLM does, for its logits).
    assert cached["prefix_cache_hit_rate"] == pytest.approx(2 * 256 / (3 * 512))
    assert uncached["prefix_cache_hit_rate"] is None
    assert uncached["total_cached_tokens"] == 0  # a count: none were cached


def test_summarize_gives_no_hit_rate_without_a_prefix_cache() -> None:
    from sim.config import SimConfig
    from sim.simulator import simulate

    trace = make_trace([512, 512], [4, 4], [0.0, 1.0], hash_ids=[[1, 2], [1, 2]], hash_block_size=256)
    requests, steps = result_tables(simulate(trace, SimConfig(enable_prefix_caching=False)))
    assert summarize(requests, steps)["prefix_cache_hit_rate"] == 0.0  # what was written before: a cache that missed
    assert summarize(requests, steps, prefix_caching=False)["prefix_cache_hit_rate"] is None


def test_a_re_summary_keeps_the_missing_hit_rate(runs, capsys) -> None:
    uncached = runs[1]
    assert summarize_main([str(uncached), "--quiet"]) == 0
    assert json.loads((uncached / "summary.json").read_text())["prefix_cache_hit_rate"] is None


def test_compare_says_the_hit_rate_is_not_compared_where_a_side_had_no_prefix_cache(runs, tmp_path, capsys) -> None:
    cached, uncached = runs
    assert compare_main([str(cached), str(uncached), "--out", str(tmp_path / "cmp"), "--no-report"]) == 0
    printed = capsys.readouterr().out.splitlines()
    row = next(line for line in printed if line.startswith("prefix-cache hit rate"))
    assert row.split() == ["prefix-cache", "hit", "rate", "33.33", "%", "n/a", "n/a", *NOT_COMPARED.split()]
    compared = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    metric = next(m for m in compared["metrics"] if m["key"] == "prefix_cache_hit_rate")
    assert (metric["real"], metric["sim"], metric["diff"], metric["rel_error"]) == (pytest.approx(1 / 3), None, None,
                                                                                     None)
    assert metric["note"] == NOT_COMPARED
    assert compared["sim"]["summary"]["prefix_cache_hit_rate"] is None
    assert all("note" not in m for m in compared["metrics"] if m["key"] != "prefix_cache_hit_rate")
    assert f"| {NOT_COMPARED} |" in (tmp_path / "cmp" / "compare.md").read_text()


def test_two_runs_with_a_prefix_cache_compare_their_hit_rates(runs, tmp_path, capsys) -> None:
    cached = runs[0]
    again = tmp_path / "again"
    _replay(cached.parent / "shared.parquet", again)
    assert compare_main([str(cached), str(again), "--out", str(tmp_path / "cmp"), "--no-report"]) == 0
    compared = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    metric = next(m for m in compared["metrics"] if m["key"] == "prefix_cache_hit_rate")
    assert (metric["rel_error"], "note" in metric) == (0.0, False)


def test_bands_of_a_run_without_a_prefix_cache_have_no_hit_rate(runs, tmp_path) -> None:
    trace = runs[0].parent / "shared.parquet"
    banded = _replay(trace, tmp_path / "banded", "--no-prefix-caching", "--bands", "2")
    assert "prefix_cache_hit_rate" not in banded["bands"]["metrics"]
    assert "num_preemptions" in banded["bands"]["metrics"]


def test_the_next_run_removes_the_staging_folders_of_dead_writers_only(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    dead, other_target = staging_path(out, "partial", dead_pid()), staging_path(tmp_path / "other", "partial", 1)
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = staging_path(out, "partial", living.pid)
        for folder in (dead, alive, other_target, tmp_path / f".run.partial-{living.pid}x"):
            folder.mkdir()
            (folder / "requests.parquet").write_bytes(b"half")
        with staged_out_dir(out, overwrite=False) as stage:
            (stage / "summary.json").write_text("{}")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [alive.name, other_target.name, f".run.partial-{living.pid}x", "run"])
    finally:
        living.kill()
        living.wait()
    assert capsys.readouterr().err == (f"note: removed {dead}, left by a writer (pid {dead.name.rsplit('-', 1)[1]}) "
                                       "that was killed before it finished\n")


def test_a_replay_killed_by_sigkill_leaves_nothing_once_the_next_one_ran(tmp_path) -> None:
    out = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, "-m", "sim.replay", str(SHAREGPT), "--out", str(out), "--quiet"],
                              cwd=Path(__file__).resolve().parents[2], stderr=subprocess.DEVNULL)
    stage = staging_path(out, "partial", killed.pid)
    deadline = time.monotonic() + 120
    while not stage.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    assert stage.is_dir() and not out.exists()  # what SIGKILL leaves: no process can act on it
    again = run_cli([SHAREGPT, "--limit", "5", "--out", out, "--no-report", "--quiet"])
    assert again.returncode == 0, again.stderr
    assert again.stderr == (f"note: removed {stage}, left by a writer (pid {killed.pid}) that was killed before it "
                            "finished\n")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
