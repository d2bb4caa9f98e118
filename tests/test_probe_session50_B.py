"""Session 50 (B): hostile input to the validation scripts, second round.

- A run given twice, by any spelling, was read twice at exit 0: step_errors and loop_gaps printed its
  rows twice, decode_fits weighed a calibration run's steps double in its fits, roofline_fit weighed a run double in
  the runs' mean error; error_stats printed two lines under one label.
  Now one line naming the second spelling and the first, exit 2 (sim.files.repeated_input_problem, shared).
- step_errors on a step log of 0 rows printed the table's header alone at exit 0.
- roofline_fit checked only that --trace was a file, and read it after minutes of fits: a folder or a JSON file failed
  then. It is read before them.
- serving_probes' summary line printed Python's ``None`` for a bracket no probe gave ("missed None").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.records import STEP_COLUMNS
from sim.files import repeated_input_problem

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"


def _script(name: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "validation" / f"{name}.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def _gpu_run(path: Path, num_steps: int) -> Path:
    """An engine.replay-like folder (summary.json says "measured") whose steps.parquet has ``num_steps`` decode
    steps of 40 rows, 5 ms each."""
    rows = [{**{c.name: 0 for c in STEP_COLUMNS}, "step": i, "num_seqs": 40, "num_decode_seqs": 40,
             "decode_context_tokens": 40_000, "max_decode_context_tokens": 1000, "num_running": 40,
             "continues_batch": int(i > 0), "start_s": 0.005 * i, "duration_s": 0.005} for i in range(num_steps)]
    schema = pa.schema([(c.name, pa.int64() if c.dtype == "int64" else pa.float64()) for c in STEP_COLUMNS])
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}\n')
    return path


def test_repeated_input_problem_sees_through_spellings_and_links(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "link").symlink_to(run)
    assert repeated_input_problem([run, tmp_path / "other"], "run folder") is None
    assert repeated_input_problem([str(run), f"{run}/"], "run folder") == (
        f"run folder {run}/ is given twice (also as {run}); give each once")
    assert repeated_input_problem([run, tmp_path / "link"], "--real") == (
        f"--real {tmp_path / 'link'} is given twice (also as {run}); give each once")


def test_step_errors_refuses_a_run_given_twice(tmp_path):
    run = _gpu_run(tmp_path / "run", 4)
    line = _one_line(_script("step_errors", "--profile", str(PROFILE), str(run), f"{run}/"))
    assert line == f"error: run folder {run}/ is given twice (also as {run}); give each once"


def test_step_errors_refuses_a_step_log_of_no_rows(tmp_path):
    run = _gpu_run(tmp_path / "run", 0)
    line = _one_line(_script("step_errors", "--profile", str(PROFILE), str(run)))
    assert line == f"error: {run / 'steps.parquet'}: no steps (0 rows); expected the step log of a GPU run"


def test_step_errors_still_prices_a_run_with_steps(tmp_path):
    run = _gpu_run(tmp_path / "run", 4)
    done = _script("step_errors", "--profile", str(PROFILE), str(run))
    assert done.returncode == 0, done.stderr
    # step 0 starts a batch, steps 1-3 repeat it; the run's line counts all four, at the 5 ms each was logged
    lines = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [line[:5] for line in lines[:2]] == [["run", "decode,", "new", "batch", "1"],
                                               ["run", "decode,", "same", "batch", "3"]]
    assert lines[2][:4] == ["run", "all", "4", "5.00"]


def test_loop_gaps_refuses_a_run_given_twice(tmp_path):
    run = _gpu_run(tmp_path / "run", 4)
    line = _one_line(_script("loop_gaps", str(run), f"{run}/."))
    assert line == f"error: run folder {run}/. is given twice (also as {run}); give each once"


def test_decode_fits_refuses_a_calibration_run_given_twice(tmp_path):
    run = _gpu_run(tmp_path / "run", 4)
    (tmp_path / "link").symlink_to(run)
    line = _one_line(_script("decode_fits", "--calibration", str(run), str(tmp_path / "link"), "--", str(run)))
    assert line == f"error: --calibration {tmp_path / 'link'} is given twice (also as {run}); give each once"


def test_roofline_fit_refuses_a_real_run_given_twice_before_the_fits(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    line = _one_line(_script("roofline_fit", "--real", str(run), f"{run}/", timeout=60))
    assert line == f"error: --real {run} is given twice (also as {run}); give each once"


@pytest.mark.parametrize("kind", ["folder", "json"])
def test_roofline_fit_reads_its_trace_before_the_fits(tmp_path, kind):
    trace = tmp_path / "trace"
    if kind == "folder":
        trace.mkdir()
        reason = f"{trace}: cannot read the trace: it is a directory, expected a parquet file"
    else:
        trace.write_text('{"runs": {}}\n')
        reason = f"{trace}: not a readable parquet file ("
    line = _one_line(_script("roofline_fit", "--trace", str(trace), timeout=60))  # the fits take minutes
    assert line.startswith(f"error: --trace {trace}: {reason}"), line
    if kind == "json":
        assert line.endswith("expected a trace written by save_trace")


def test_roofline_fit_still_names_a_missing_trace(tmp_path):
    line = _one_line(_script("roofline_fit", "--trace", str(tmp_path / "none.parquet"), timeout=60))
    assert line == f"error: --trace {tmp_path / 'none.parquet'} does not exist"


def test_error_stats_refuses_a_label_given_twice():
    line = _one_line(_script("error_stats", "a=validation/results", "a=validation/results"))
    assert line == "error: a=validation/results: the label 'a' is given twice; give each cost model its own"


def test_error_stats_takes_one_folder_under_two_labels():
    done = _script("error_stats", "a=validation/results", "b=validation/results")
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == ["a", "b"]


def test_serving_probes_says_no_probe_missed_instead_of_none(tmp_path):
    probe = {"qps": 5.0, "ttft_ms_p50": 25.0, "ttft_ms_p90": None, "tpot_ms_p50": 10.0, "output_throughput": 1000.0,
             "met_slo": True}
    results = tmp_path / "serving.json"
    results.write_text(json.dumps({"trace": "traces/sharegpt.parquet", "num_requests": 300, "ttft_p90_ms_limit": 100.0,
                                   "runs": {"now": [probe], "before": []}}))
    out = tmp_path / "table.json"
    done = _script("serving_probes", str(results), "--gpu", "h100", "--json", str(out), timeout=600)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert "GPU met 5.0, missed at no probe; simulator met " in summary and "None" not in summary, summary
    assert json.loads(out.read_text())["gpu_missed_qps"] is None  # JSON's null: missing, as a reader expects
