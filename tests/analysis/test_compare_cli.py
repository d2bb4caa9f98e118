"""`python -m analysis.compare` end to end: outputs, schedule check, exit codes on bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from plotly.offline import get_plotlyjs

from analysis.compare.cli import main
from analysis.compare.report import COMPARE_CHART_TITLES
from tests.analysis.test_compare import real_requests, real_steps, write_pair, write_run

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) -> (exit code, stdout, stderr); argparse's SystemExit counts as a return."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_writes_table_json_markdown_parquet_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(out)], capsys)
    assert code == 0, stderr
    assert "TTFT p50 (ms)" in stdout and "+10.00 %" in stdout
    assert "config differences: max_num_seqs real=256 sim=8" in stdout
    assert "requests matched on request_id: 3 of 3 real (100.0 %)" in stdout
    assert "schedules" not in stdout  # only with --schedule
    document = json.loads((out / "compare.json").read_text())
    rows = {row["key"]: row for row in document["metrics"]}
    assert rows["ttft_ms.p50"]["rel_error"] == pytest.approx(0.10)
    assert rows["num_preemptions"]["diff"] == 2 and rows["num_preemptions"]["rel_error"] is None
    assert document["requests"]["matched_share_real"] == 1.0
    assert document["schedule"]["requests"]["differing_columns"] == {"cached_tokens": 1, "num_preemptions": 1}
    markdown = (out / "compare.md").read_text()
    assert "| TTFT p50 (ms) | 200.0 | 220.0 | +20.00 | +10.00 % |" in markdown

    pairs = pl.read_parquet(out / "compare.parquet")
    assert pairs.height == 3 and "ttft_rel_error" in pairs.columns
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count(get_plotlyjs()[:2000]) == 1 and "<script src=" not in page
    for title in COMPARE_CHART_TITLES.values():
        assert title in page
    assert page.count('class="plotly-graph-div"') == len(COMPARE_CHART_TITLES)
    assert "Simulation vs real: sim vs real" in page and "roofline-estimate" in page


def test_cli_schedule_identical_and_required(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    twin = tmp_path / "twin"
    shutil.copytree(real_dir, twin)
    code, stdout, _ = run_cli([str(real_dir), str(twin), "--out", str(tmp_path / "o1"), "--no-report",
                               "--require-identical-schedule"], capsys)
    assert code == 0
    assert "schedules identical: 3 steps" in stdout
    assert not (tmp_path / "o1" / "report.html").exists()
    code, stdout, _ = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "o2"), "--no-report",
                               "--schedule"], capsys)
    assert code == 0  # --schedule only reports
    assert "schedules differ" in stdout and "step 3 exists only in sim" in stdout
    code, stdout, _ = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "o3"), "--no-report",
                               "--require-identical-schedule"], capsys)
    assert code == 1
    assert "schedules differ" in stdout


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing_dir", "nope: no such directory"),
        ("missing_file", "steps.parquet: no such file"),
        ("bad_parquet", "requests.parquet: not a readable parquet file"),
        ("missing_column", "requests.parquet: requests table is missing columns: token_times_s"),
        ("bad_summary", "summary.json: not a readable JSON file"),
        ("fifo_summary", "summary.json: not a readable JSON file (not a regular file: a FIFO or a device)"),  # hung
        ("no_overlap", "are runs of different requests (3 real, 3 sim, 0 request ids in common"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    if case == "missing_dir":
        sim_dir = tmp_path / "nope"
    elif case == "missing_file":
        (sim_dir / "steps.parquet").unlink()
    elif case == "bad_parquet":
        (sim_dir / "requests.parquet").write_text("not parquet")
    elif case == "missing_column":
        real_requests().drop("token_times_s").write_parquet(sim_dir / "requests.parquet")
    elif case == "bad_summary":
        (sim_dir / "summary.json").write_text("{oops")
    elif case == "fifo_summary":
        (sim_dir / "summary.json").unlink(missing_ok=True)
        os.mkfifo(sim_dir / "summary.json")
    elif case == "no_overlap":
        renamed = real_requests().with_columns(("x" + real_requests()["request_id"]).alias("request_id"))
        write_run(sim_dir, renamed, real_steps())
    code, stdout, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("error: ") and expected in stderr
    assert "Traceback" not in stderr
    if case == "no_overlap":
        assert str(real_dir) in stderr and str(sim_dir) in stderr
    elif case != "missing_dir":
        assert str(sim_dir) in stderr
    assert not (tmp_path / "out").exists()


def test_runs_of_other_requests_are_refused_unless_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, real_requests().head(2), real_steps())  # e.g. the simulation ran with another --limit
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "(3 real, 2 sim, 2 request ids in common" in stderr
    code, stdout, _ = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out"),
                               "--allow-different-requests", "--no-report"], capsys)
    assert code == 0 and "requests matched on request_id: 2 of 3 real" in stdout
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out"),
                               "--allow-different-requests"], capsys)
    assert code == 2 and "exists and is not empty; pass --overwrite" in stderr


def test_module_entry_point_has_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "analysis.compare", str(tmp_path / "a"), str(tmp_path / "b")],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'a'}: no such directory"


def test_simulated_replays_compare_identical_and_different(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two identical simulations: zero errors and the same schedule; a smaller batch cap changes it."""
    from cli.sim_replay import main as replay_main

    trace = str(REPO_ROOT / "traces" / "sharegpt.parquet")
    base = ["--limit", "40", "--quiet", "--no-report"]
    runs = {name: tmp_path / name for name in ("a", "b", "small")}
    assert replay_main([trace, *base, "--out", str(runs["a"])]) == 0
    assert replay_main([trace, *base, "--out", str(runs["b"])]) == 0
    assert replay_main([trace, *base, "--max-num-seqs", "2", "--out", str(runs["small"])]) == 0
    capsys.readouterr()
    code, stdout, _ = run_cli([str(runs["a"]), str(runs["b"]), "--out", str(tmp_path / "same"),
                               "--require-identical-schedule", "--no-report"], capsys)
    assert code == 0, stdout
    assert "schedules identical:" in stdout
    rows = json.loads((tmp_path / "same" / "compare.json").read_text())["metrics"]
    assert all(row["rel_error"] in (0.0, None) for row in rows)
    code, stdout, _ = run_cli([str(runs["a"]), str(runs["small"]), "--out", str(tmp_path / "diff"),
                               "--require-identical-schedule"], capsys)
    assert code == 1
    assert "schedules differ" in stdout and "first: replica 0, step" in stdout
    assert (tmp_path / "diff" / "report.html").exists()


def test_a_run_that_admitted_no_prompt_has_no_hit_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-model-len below every prompt rejects every request: the hit rate printed 0.0 % (0.0 in summary.json),
    a cache that missed every prompt, though none ever reached it. It is null, and compares as n/a."""
    from cli.sim_replay import main as replay_main

    trace = str(REPO_ROOT / "traces" / "sharegpt.parquet")
    rejected, served = tmp_path / "rejected", tmp_path / "served"
    assert replay_main([trace, "--limit", "20", "--max-model-len", "1", "--out", str(rejected)]) == 0
    assert "prefix cache hit rate   -" in capsys.readouterr().out.splitlines()
    summary = json.loads((rejected / "summary.json").read_text())
    assert summary["num_rejected"] == 20 and summary["total_prompt_tokens"] == 0
    assert summary["prefix_cache_hit_rate"] is None
    assert (rejected / "report.html").is_file()
    assert replay_main([trace, "--limit", "20", "--quiet", "--no-report", "--out", str(served)]) == 0
    served_rate = json.loads((served / "summary.json").read_text())["prefix_cache_hit_rate"]
    code, stdout, stderr = run_cli([str(served), str(rejected), "--out", str(tmp_path / "compared")], capsys)
    assert code == 0, stderr
    rows = {row["key"]: row for row in json.loads((tmp_path / "compared" / "compare.json").read_text())["metrics"]}
    assert rows["prefix_cache_hit_rate"] == {**rows["prefix_cache_hit_rate"], "real": served_rate, "sim": None,
                                             "diff": None, "rel_error": None}
    assert (tmp_path / "compared" / "report.html").is_file()
    line = next(line for line in stdout.splitlines() if line.startswith("prefix-cache hit rate"))
    assert line.split()[-3:] == ["n/a", "n/a", "n/a"]  # sim, diff, relative error


def test_empty_out_is_refused_before_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out "" wrote a new folder under runs/ (elsewhere: the current folder), not what was typed."""
    real_dir, sim_dir = write_pair(tmp_path)
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", ""], capsys)
    assert code == 2 and stderr.strip().endswith(
        "error: argument --out: is empty; name a folder for the run (--help lists the options)")


def test_out_never_replaces_an_input_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--out REAL_DIR --overwrite replaced the real run with the comparison (a run folder holds only run files)."""
    real_dir, sim_dir = write_pair(tmp_path)
    before = {p.name: p.read_bytes() for p in real_dir.iterdir()}
    for out in (real_dir, tmp_path):  # the input itself, or a folder holding it
        code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(out), "--overwrite"], capsys)
        assert code == 2 and f"error: --out {out} is or holds the input {real_dir.resolve()}" in stderr
    assert {p.name: p.read_bytes() for p in real_dir.iterdir()} == before


def test_a_column_of_the_wrong_type_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, real_requests(), real_steps().with_columns(pl.lit("x").alias("num_seqs")))
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr.count("\n") == 1  # polars' own message spans four lines
    assert stderr == (f"error: {sim_dir / 'steps.parquet'}: steps table: column 'num_seqs' holds String values that "
                      "do not convert to Int64\n")


def test_a_time_no_run_can_hold_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An arrival at -1e300 s ran to exit 0 with numpy overflow warnings on stderr."""
    real_dir, sim_dir = write_pair(tmp_path)
    requests = real_requests()
    arrivals = requests["arrival_s"].to_list()
    arrivals[1] = -1e300
    write_run(sim_dir, requests.with_columns(pl.Series("arrival_s", arrivals)), real_steps())
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr == (f"error: {sim_dir / 'requests.parquet'}: requests table: column 'arrival_s' is "
                                    "-1e+300 at row 1; times must be within 2e+12 seconds of the run's start\n")
    assert not (tmp_path / "out").exists()


def _set(frame: pl.DataFrame, column: str, row: int, value) -> pl.DataFrame:
    values = frame[column].to_list()
    values[row] = value
    return frame.with_columns(pl.Series(column, values, dtype=frame.schema[column]))


IMPOSSIBLE_REQUESTS = {  # each ran to exit 0, and its metrics were written as if measured
    "negative output": (lambda r: _set(r, "output_tokens", 1, -1), "'output_tokens' is -1 at row 1"),
    "finish before arrival": (lambda r: _set(r, "finish_s", 2, 1.5), "'finish_s' is 1.5 at row 2; expected a time "
                                                                      ">= arrival_s (2)"),
    "first token after finish": (lambda r: _set(r, "first_token_s", 0, 5.0), "'finish_s' is 0.3 at row 0; expected "
                                                                             "a time >= first_token_s (5)"),
    "unknown finish reason": (lambda r: _set(r, "finish_reason", 1, "zzz"), "'finish_reason' is 'zzz' at row 1"),
    "null finish reason": (lambda r: _set(r, "finish_reason", 0, None), "'finish_reason' is null at row 0"),
    "repeated id": (lambda r: _set(r, "request_id", 2, "r0"), "'request_id' is 'r0' at row 2; expected one row per "
                                                              "request (it is also at row 0)"),
    "null id": (lambda r: _set(r, "request_id", 1, None), "'request_id' is null at row 1"),
    # Token times were not checked at all: NaN, 1e300, a time before the one before it or before the arrival went
    # into the ITLs and the makespan (negative gaps, a mean ITL of 1e299 ms, numpy overflow warnings).
    "token time nan": (lambda r: _set(r, "token_times_s", 1, [1.2, float("nan"), 1.6]),
                       "'token_times_s' is nan at row 1; expected finite times within 2e+12 seconds"),
    "token time huge": (lambda r: _set(r, "token_times_s", 1, [1.2, 1e300]),
                        "'token_times_s' is 1e+300 at row 1; expected finite times within 2e+12 seconds"),
    "token times out of order": (lambda r: _set(r, "token_times_s", 2, [2.3, 2.9, 2.6]),
                                 "'token_times_s' is 2.6 at row 2; expected times in order (item 2 is before item "
                                 "1, 2.9)"),
    "token before arrival": (lambda r: _set(r, "token_times_s", 1, [0.5, 1.4, 1.6]),
                             "'token_times_s' is 0.5 at row 1; expected a first token time >= arrival_s (1)"),
    # A last token after the finish, or more token times than tokens (a vLLM result file importing them), went into
    # the ITLs and the makespan as if measured.
    "token after finish": (lambda r: _set(r, "token_times_s", 1, [1.2, 1.4, 1.7]),
                           "'token_times_s' is 1.7 at row 1; expected a last token time <= finish_s (1.6)"),
    "more token times than tokens": (lambda r: _set(r, "token_times_s", 1, [1.2, 1.3, 1.4, 1.5, 1.6]),
                                     "'token_times_s' holds 5 times at row 1; expected at most output_tokens (3)"),
    # A negative TTFT or queue time was averaged into the metrics.
    "first token before arrival": (lambda r: _set(r, "first_token_s", 1, 0.5),
                                   "'first_token_s' is 0.5 at row 1; expected a time >= arrival_s (1)"),
    "scheduled before arrival": (lambda r: _set(r, "first_scheduled_s", 2, 1.5),
                                 "'first_scheduled_s' is 1.5 at row 2; expected a time >= arrival_s (2)"),
    "first token before first step": (lambda r: _set(r, "first_scheduled_s", 0, 0.2),
                                      "'first_token_s' is 0.1 at row 0; expected a time >= first_scheduled_s (0.2)"),
    # Two counts of 2**62 summed past int64: a negative total output and throughput, exit 0.
    "output count past the bound": (lambda r: _set(r, "output_tokens", 0, 2**62),
                                    "'output_tokens' is 4611686018427387904 at row 0; expected at most 2**40"),
    "negative replica": (lambda r: _set(r, "replica", 1, -1), "'replica' is -1 at row 1; expected an integer >= 0"),
    # TTFT and TPOT silently became n/a.
    "finished without a first token": (lambda r: _set(r, "first_token_s", 1, None),
                                       "'first_token_s' is null at row 1; expected a time: the request finished "),
    # polars casts true to 1, "0.5" to 0.5 and 100.5 tokens to 100 without a word.
    "counts as booleans": (lambda r: r.with_columns(pl.lit(True).alias("cached_tokens")),
                           "'cached_tokens' holds Boolean values that do not convert to Int64"),
    "times as text": (lambda r: r.with_columns(pl.col("arrival_s").cast(pl.Utf8)),
                      "'arrival_s' holds String values that do not convert to Float64"),
    "fractional tokens": (lambda r: r.with_columns(pl.Series("prompt_tokens", [100.0, 100.5, 100.0])),
                          "'prompt_tokens' is 100.5 at row 1; expected a whole number"),
}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE_REQUESTS))
def test_an_impossible_request_table_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case) -> None:
    mutate, message = IMPOSSIBLE_REQUESTS[case]
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, mutate(real_requests()), real_steps())
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"error: {sim_dir / 'requests.parquet'}: requests table: column ") and message in stderr
    assert not (tmp_path / "out").exists()


def test_a_run_without_any_token_times_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """token_times_s null on every row (none recorded, as one null row is read) was a NotImplementedError traceback
    ('Series of type Null does not have lt operator') from the table check."""
    real_dir, sim_dir = write_pair(tmp_path)
    nulls = pl.Series("token_times_s", [None] * 3, dtype=pl.List(pl.Float64))
    write_run(sim_dir, real_requests().with_columns(nulls), real_steps())
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 0, stderr
    assert "Traceback" not in stderr


def test_a_step_of_negative_duration_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, real_requests(), _set(real_steps(), "duration_s", 1, -0.5))
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr == (f"error: {sim_dir / 'steps.parquet'}: steps table: column 'duration_s' is -0.5 "
                                    "at row 1; expected a duration >= 0 seconds\n")


@pytest.mark.parametrize(("mutate", "message"), [
    # Each was compared with exit 0: a NaN KV usage, a negative batch or step written into the metrics.
    (lambda s: _set(s, "kv_usage", 1, float("nan")), "'kv_usage' is nan at row 1; expected a share of the KV cache "
                                                     "from 0 to 1"),
    (lambda s: _set(s, "kv_usage", 0, 1.5), "'kv_usage' is 1.5 at row 0; expected a share of the KV cache from 0 to 1"),
    (lambda s: _set(s, "num_seqs", 2, -1), "'num_seqs' is -1 at row 2; expected an integer >= 0"),
    (lambda s: _set(s, "step", 1, -7), "'step' is -7 at row 1; expected an integer >= 0"),
    (lambda s: s.with_columns(pl.lit(0.5).alias("replica")), "'replica' is 0.5 at row 0; expected a whole number"),
])
def test_an_impossible_step_table_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate,
                                              message) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, real_requests(), mutate(real_steps()))
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr == f"error: {sim_dir / 'steps.parquet'}: steps table: column {message}\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "expected"), [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read; expected the JSON a run writes"),
    ('{"config": {"x": ' + "9" * 5000 + "}}", "not a readable JSON file (a number of more than 4300 digits)"),
])
def test_an_unreadable_summary_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text,
                                           expected) -> None:
    """Both were tracebacks (RecursionError, ValueError) after the tables had been read."""
    real_dir, sim_dir = write_pair(tmp_path)
    (sim_dir / "summary.json").write_text(text)
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr == f"error: {sim_dir / 'summary.json'}: {expected}\n"
    assert not (tmp_path / "out").exists()


def test_a_run_compared_with_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same folder twice printed a table of 0 % errors, as if the simulator were exact."""
    real_dir, _ = write_pair(tmp_path)
    code, _, stderr = run_cli([str(real_dir), str(real_dir / ".." / real_dir.name), "--out", str(tmp_path / "o")],
                              capsys)
    assert code == 2
    assert stderr.strip() == f"error: REAL_DIR and SIM_DIR are the same run ({real_dir}); compare two runs"
    assert not (tmp_path / "o").exists()


BAD_SUMMARIES = {  # each was a traceback (TypeError, AttributeError, KeyError, ValueError) after both runs were read
    "warnings a string": ({"warnings": "x"}, "'warnings' is x; expected list"),
    "warning a number": ({"warnings": [1]}, "warnings[0] is 1; expected an object with a 'code' and a 'message'"),
    "band without p5": ({"bands": {"metrics": {"ttft_ms": {"p50": {"median": 1.0, "p95": 2.0}}}}},
                        "the band of 'ttft_ms.p50' is {'median': 1.0, 'p95': 2.0}; expected finite numbers "
                        "p5 <= median <= p95"),
    "band of text": ({"bands": {"metrics": {"output_throughput": {"median": 1.0, "p5": "x", "p95": 2.0}}}},
                     "the band of 'output_throughput' is {'median': 1.0, 'p5': 'x', 'p95': 2.0}; expected finite "
                     "numbers p5 <= median <= p95"),
    "bands without metrics": ({"bands": {"num_replays": 2}}, "'bands' is {'num_replays': 2}; expected an object "
                                                             "with 'metrics'"),
}


@pytest.mark.parametrize("case", sorted(BAD_SUMMARIES))
def test_a_malformed_summary_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case) -> None:
    summary, shown = BAD_SUMMARIES[case]
    real_dir, sim_dir = write_pair(tmp_path)
    write_run(sim_dir, real_requests(), real_steps(), {"cost_model": "roofline-estimate", **summary})
    code, _, stderr = run_cli([str(real_dir), str(sim_dir), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and stderr.startswith(f"error: {sim_dir / 'summary.json'}: {shown}") and stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
