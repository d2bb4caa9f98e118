"""The analysis commands on hostile and odd-but-valid input, as an outside evaluator probes them: one error line
and exit 2 for bad input, nothing left behind, no traceback when stdout closes early, and searches that end saying
why when their SLO can never be met or is always met."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.bisection import CapacitySearch, SearchParams
from analysis.capacity.cli import main as capacity_main
from analysis.capacity.point import PointResult
from analysis.capacity.sweep import load_independent_failures
from analysis.capacity.workload import (
    MAX_STREAM_REQUESTS,
    SessionLibrary,
    WorkloadParams,
    drawn_stream_requests,
    max_stream_qps,
)
from analysis.compare.cli import main as compare_main
from analysis.slo import parse_slos
from analysis.summarize import main as summarize_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error
from traces.schema import load_trace, save_trace

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two small simulated runs of the same 12 requests (other --max-num-seqs, so they differ)."""
    root = tmp_path_factory.mktemp("runs")
    folders = {"a": root / "a", "b": root / "b"}
    for name, extra in (("a", []), ("b", ["--max-num-seqs", "4"])):
        assert replay_main([str(SHAREGPT), "--limit", "12", "--quiet", "--no-report", *extra,
                            "--out", str(folders[name])]) == 0
    return folders


def _copy(run: Path, to: Path) -> Path:
    to.mkdir()
    for file in run.iterdir():
        (to / file.name).write_bytes(file.read_bytes())
    return to


# ---- SLO strings -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    # Was "cannot parse SLO 'ttft_p90=-1s'; expected ..." with no word of what was wrong.
    ("ttft_p90=-1s", "cannot parse SLO 'ttft_p90=-1s': the limit is negative; expected a duration > 0 "
                     "(metric_statistic=value+unit, e.g. ttft_p90=2s,tpot_p90=100ms)"),
    # Was told it "needs a unit": it has one, just not one we take.
    ("ttft_p90=1us", "SLO 'ttft_p90=1us' needs a unit; supported: ms, s (e.g. 2s or 100ms), and 'us' is not one of "
                     "them"),
    ("ttft_p90=2", "SLO 'ttft_p90=2' needs a unit; supported: ms, s (e.g. 2s or 100ms)"),
    ("ttft_p90=-0s", "SLO 'ttft_p90=-0s': SLO limit must be a finite number > 0 seconds, got -0.0"),
])
def test_slo_strings_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_slos(text)
    assert str(caught.value) == message


def test_a_negative_slo_on_the_capacity_command_line(tmp_path, capsys) -> None:
    line = cli_error(capacity_main, [str(SHAREGPT), "--slo", "ttft_p90=-2s", "--out", str(tmp_path / "out")], capsys)
    assert line == ("error: argument --slo: cannot parse SLO 'ttft_p90=-2s': the limit "
                    "is negative; expected a duration > 0 (metric_statistic=value+unit, e.g. ttft_p90=2s,"
                    "tpot_p90=100ms) (--help lists the options)")
    assert not (tmp_path / "out").exists()


# ---- compare: --out checked before any work, nothing left behind ----------------------------------------------------
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder nobody can create entries in")
def test_compare_checks_out_before_printing_a_comparison(runs, capsys) -> None:
    """/proc/x passed the checks and failed at the end: the whole table was printed first, as if saved."""
    out = "/proc/nanoserve-hostile-out"
    with pytest.raises(SystemExit) as exited:
        compare_main([str(runs["a"]), str(runs["b"]), "--out", out])
    captured = capsys.readouterr()
    assert exited.value.code == 2
    assert (captured.out, captured.err) == ("", f"error: --out {out}: cannot write there (No such file or directory)\n")


def test_compare_with_a_bad_input_leaves_no_folder(runs, tmp_path, capsys) -> None:
    broken = _copy(runs["b"], tmp_path / "broken")
    (broken / "steps.parquet").unlink()
    out = tmp_path / "new" / "deeper" / "out"
    line = cli_error(compare_main, [str(runs["a"]), str(broken), "--out", str(out)], capsys)
    assert line == f"error: {broken / 'steps.parquet'}: no such file"
    assert not (tmp_path / "new").exists()  # the folders made for --out went again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_capacity_with_a_missing_trace_leaves_no_folder(tmp_path, capsys) -> None:
    out = tmp_path / "new" / "out"
    line = cli_error(capacity_main, [str(tmp_path / "none.parquet"), "--slo", "ttft_p90=2s", "--quiet",
                                     "--out", str(out)], capsys)
    assert line == f"error: TRACE: {tmp_path / 'none.parquet'}: cannot read the trace: no such file"
    assert list(tmp_path.iterdir()) == []


def test_compare_of_runs_where_every_request_was_rejected(tmp_path, capsys) -> None:
    """Valid but odd: nothing finished on either side. Every latency is n/a (no samples), never 0 or NaN."""
    runs = []
    for name in ("x", "y"):
        runs.append(tmp_path / name)
        assert replay_main([str(SHAREGPT), "--limit", "6", "--max-model-len", "16", "--quiet", "--no-report",
                            "--out", str(runs[-1])]) == 0
    assert compare_main([str(runs[0]), str(runs[1]), "--out", str(tmp_path / "out"), "--no-report"]) == 0
    stdout = capsys.readouterr().out
    assert "TTFT p90 (ms)                  n/a     n/a   n/a         n/a" in stdout
    assert "rejected requests                6       6     0     +0.00 %" in stdout
    document = json.loads((tmp_path / "out" / "compare.json").read_text())
    rows = {row["key"]: row for row in document["metrics"]}
    assert rows["ttft_ms.p90"]["real"] is None and rows["ttft_ms.p90"]["rel_error"] is None
    assert rows["num_finished"]["real"] == 0 and rows["num_finished"]["rel_error"] is None


# ---- stdout closed early (| head) --------------------------------------------------------------------------------
def _with_stdout_closed(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``python -m ...`` whose stdout is a pipe closed before it prints anything, as ``| head -0`` leaves it."""
    proc = subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(argv, proc.returncode, "", stderr)


def test_compare_writes_its_outputs_when_stdout_closes(runs, tmp_path) -> None:
    """A BrokenPipeError traceback (exit 1) at the first print, before the outputs were written."""
    out = tmp_path / "out"
    done = _with_stdout_closed(["analysis.compare", str(runs["a"]), str(runs["b"]), "--out", str(out),
                                "--no-report"])
    assert (done.returncode, done.stderr) == (0, "")
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.parquet"]


def test_summarize_goes_on_to_every_folder_when_stdout_closes(runs, tmp_path) -> None:
    first, second = _copy(runs["a"], tmp_path / "first"), _copy(runs["b"], tmp_path / "second")
    (second / "summary.json").unlink()
    done = _with_stdout_closed(["analysis.summarize", str(first), str(second)])
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads((second / "summary.json").read_text())["num_requests"] == 12


# ---- summarize: what is not a run folder -------------------------------------------------------------------------
def test_summarize_refuses_a_file_before_rewriting_any_folder(runs, tmp_path, capsys) -> None:
    good = _copy(runs["a"], tmp_path / "good")
    line = cli_error(summarize_main, [str(good), str(good / "summary.json"), "--report"], capsys)
    assert line == (f"error: {good / 'summary.json'} is a file, not a folder; expected a replay output folder (the "
                    f"folder holding it: {good})")
    assert not (good / "report.html").exists()  # the good folder was not summarized either
    line = cli_error(summarize_main, [str(tmp_path / "result.json")], capsys)
    assert line == f"error: {tmp_path / 'result.json'} does not exist; expected a replay output folder"
    (tmp_path / "result.json").write_text("{}")
    line = cli_error(summarize_main, [str(tmp_path / "result.json")], capsys)
    assert line == (f"error: {tmp_path / 'result.json'} is a file, not a folder; expected a replay output folder (for "
                    "a vllm bench serve result, python -m analysis.vllm_import RESULT.json --out DIR makes one)")


@pytest.mark.parametrize(("column", "row", "expected"), [
    # A null arrival gave a makespan of 0 s and every latency n/a, summarized as if measured.
    ("arrival_s", 0, "column 'arrival_s' is null at row 0; expected a time: every request arrives"),
    # A served request without a finish dropped out of E2E's samples without a word.
    ("finish_s", 3, "column 'finish_s' is null at row 3; expected a time: the request finished (length)"),
])
def test_a_table_with_a_missing_time_is_refused(runs, tmp_path, capsys, column, row, expected) -> None:
    run = _copy(runs["a"], tmp_path / "run")
    table = pl.read_parquet(run / "requests.parquet")
    table = table.with_columns(pl.when(pl.int_range(pl.len()) == row).then(None).otherwise(pl.col(column))
                               .alias(column))
    table.write_parquet(run / "requests.parquet")
    before = (run / "summary.json").read_bytes()
    assert cli_error(summarize_main, [str(run)], capsys) == f"error: {run / 'requests.parquet'}: requests table: " \
                                                            f"{expected}"
    assert (run / "summary.json").read_bytes() == before
    line = cli_error(compare_main, [str(runs["a"]), str(run), "--out", str(tmp_path / "out")], capsys)
    assert line == f"error: {run / 'requests.parquet'}: requests table: {expected}"


def test_python_m_analysis_report_points_to_the_command(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "analysis.report", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: analysis.report is not a command; write a run folder's report.html with "
                           "python -m analysis.summarize RUN_DIR --report\n")


# ---- capacity: SLOs never met, always met, or judging nothing ------------------------------------------------------
def test_an_slo_no_trace_request_can_be_judged_by(tmp_path, capsys) -> None:
    """One-token outputs have no TPOT: the limit passed at every load and its column read '-' without a word."""
    trace = tmp_path / "one-token.parquet"
    frame = load_trace(SHAREGPT).requests.head(20).with_columns(output_tokens=pl.lit(1, pl.Int64))
    save_trace(frame, trace, hash_block_size=16)
    line = cli_error(capacity_main, [str(trace), "--slo", "ttft_p90=2s,tpot_p90=1ms", "--quiet",
                                     "--out", str(tmp_path / "out")], capsys)
    assert line == ("error: --slo: tpot_p90=1ms judges nothing: every request of the trace asks for one output token, "
                    "so TPOT has no samples and the SLO would be met at every load; drop it or limit ttft, e2e or "
                    "queue")
    assert not (tmp_path / "out").exists()


def _point(qps: float, ttft_p90_ms: float | None, ttft_mean_ms: float, *, meets: bool = False,
           stable: bool = True) -> PointResult:
    latency = {"p50": 3.0, "p90": ttft_p90_ms, "p99": 9.0, "mean": ttft_mean_ms}
    return PointResult(qps=qps, seed=0, duration_scale=1.0, feasible=meets and stable, meets_slos=meets,
                       stable=stable, stopped_early=False, goodput_rps=0.0, slo_values_ms={"ttft_p90": ttft_p90_ms},
                       num_requests=100, num_finished=100, num_rejected=0, stream_requests=130,
                       stream_duration_s=100.0, warmup_s=25.0, request_throughput_rps=None,
                       output_throughput_tok_s=None, total_output_tokens=1000, prefix_cache_hit_rate=None,
                       num_preemptions=0, latency_ms={"ttft_ms": latency})


def test_failures_the_load_no_longer_moves() -> None:
    points = {4.0: _point(4.0, 8.5, 4.1), 2.0: _point(2.0, 8.1, 4.0), 1.0: _point(1.0, 8.1, 4.0)}
    assert load_independent_failures(points, [1.0]) == {
        1.0: "from 2 down to 1 req/s the SLO statistics stayed at ttft_p90 8.1 ms"}
    assert load_independent_failures(points, [2.0]) == {}  # 8.5 at 4 req/s: the load still moved it
    points[1.0] = _point(1.0, 8.1, 3.9)  # the same p90, a lower mean: some request still waited at 2 req/s
    assert load_independent_failures(points, [1.0]) == {}
    points[1.0] = _point(1.0, 8.1, 4.0, stable=False)  # unstable at a lower load: not a plain SLO miss
    assert load_independent_failures(points, [1.0]) == {}
    unfinished = {2.0: _point(2.0, None, 4.0), 1.0: _point(1.0, None, 4.0)}
    assert load_independent_failures(unfinished, [1.0]) == {
        1.0: "from 2 down to 1 req/s the SLO statistics stayed at ttft_p90 unbounded (unfinished requests)"}


def test_a_search_stops_where_the_load_no_longer_matters() -> None:
    """An SLO below what a request alone takes halved 20 times, to 1e-5 req/s, then advised raising
    --max-iterations."""
    search = CapacitySearch(SearchParams(start_qps=8.0, max_iterations=20))
    tried = []
    while not search.done:
        candidates = search.propose()
        tried += candidates
        same = {q: "from 4 down to 2 req/s the SLO statistics stayed at ttft_p90 8.1 ms" for q in candidates
                if q <= 2.0}
        search.observe({q: False for q in candidates}, load_independent=same)
    outcome = search.outcome()
    assert tried == [8.0, 4.0, 2.0] and outcome.max_qps is None and not outcome.converged
    assert outcome.notes == ("no QPS can meet the SLOs: from 4 down to 2 req/s the SLO statistics stayed at ttft_p90 "
                             "8.1 ms, so requests no longer wait for each other there and a lower load fails alike: "
                             "the SLOs are tighter than the configuration serves a request alone",)


def test_a_search_that_always_passes_stops_at_the_largest_stream() -> None:
    """With a few --min-requests every load passed; doubling went on to 1.4e6 req/s, where the stream was too large
    and the sweep ended in an error after all its simulations, writing nothing."""
    search = CapacitySearch(SearchParams(start_qps=5.0, max_iterations=20, qps_ceiling=30.0))
    tried = []
    while not search.done:
        candidates = search.propose()
        tried += candidates
        search.observe({q: True for q in candidates})
    outcome = search.outcome()
    assert tried == [5.0, 10.0, 20.0] and outcome.max_qps == 20.0
    assert outcome.notes == ("capacity is at least 20 req/s: every QPS tried met the SLOs, and a stream above 30 "
                             "req/s would hold more requests than one simulation takes, so the search stopped there "
                             "(streams of a few requests may never load the configuration: see --min-requests and "
                             "--min-duration-s)",)


def test_the_largest_stream_is_the_last_that_fits() -> None:
    library = SessionLibrary.from_trace(load_trace(SHAREGPT).head(100))
    workload = WorkloadParams(min_duration_s=0.0, min_requests=100)
    ceiling = max_stream_qps(library, workload, 2.0)
    assert 1e5 < ceiling < 1e7  # the sessions' lead-in bounds it, not --min-requests
    for qps, fits in ((ceiling, True), (ceiling * 1.001, False)):
        duration_s = workload.duration_s(qps, 2.0)
        drawn = drawn_stream_requests(library, qps, duration_s, workload.think_times)
        assert (drawn <= 2 * MAX_STREAM_REQUESTS) is fits
    assert max_stream_qps(library, WorkloadParams(min_duration_s=1e6, min_requests=100)) == pytest.approx(10.0)
