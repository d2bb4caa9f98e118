"""Session 39 (helper D) probes of validation/serving_probes.py (serving.py's results as hostile input, and the trace
as an input that --json must not replace), and Ctrl-C in the scripts run as files (benchmarks/, validation/)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.interrupt import one_line_script_errors
from tests.sim.helpers import write_trace

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "validation" / "serving_probes.py"
PROBE = {"qps": 5.0, "ttft_ms_p50": 20.0, "ttft_ms_p90": 50.0, "tpot_ms_p50": 10.0, "output_throughput": 1000.0,
         "met_slo": True}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=600)


def _results(tmp_path: Path, trace_file: Path, probe: dict = PROBE, **settings) -> Path:
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"trace": str(trace_file), "num_requests": 20, "ttft_p90_ms_limit": 100.0,
                                "runs": {"now": [probe]}, **settings}))
    return path


@pytest.fixture
def trace(tmp_path) -> Path:
    return write_trace(tmp_path / "t.parquet", [100] * 20, [4] * 20, [0.1 * i for i in range(20)])


@pytest.mark.parametrize("settings, problem", [
    # each was a ValueError or TypeError traceback
    ({"num_requests": "abc"}, "'num_requests' is 'abc'; expected an integer from 1 to 100000"),
    ({"num_requests": 0}, "'num_requests' is 0; expected an integer from 1 to 100000"),
    ({"num_requests": 1.5}, "'num_requests' is 1.5; expected an integer from 1 to 100000"),
    ({"ttft_p90_ms_limit": None}, "'ttft_p90_ms_limit' is None; expected a finite number of milliseconds > 0"),
    ({"ttft_p90_ms_limit": "1s"}, "'ttft_p90_ms_limit' is '1s'; expected a finite number of milliseconds > 0"),
    ({"trace": 5}, "'trace' is 5; expected the path serving.py replayed"),
])
def test_bad_settings_are_named_in_one_line(tmp_path, trace, settings, problem):
    results = _results(tmp_path, trace, **settings)
    done = _run(str(results), "--gpu", "h100")
    assert done.returncode == 2
    assert done.stderr == f"error: {results}: {problem}\n"


def test_a_limit_of_nan_is_refused(tmp_path, trace):
    # it printed "TTFT p90 <= nan ms" and every simulated verdict a miss
    results = _results(tmp_path, trace)
    results.write_text(results.read_text().replace("100.0", "NaN"))
    done = _run(str(results), "--gpu", "h100")
    assert done.returncode == 2
    assert done.stderr == (f"error: {results}: 'ttft_p90_ms_limit' is nan; expected a finite number of milliseconds "
                           "> 0\n")


@pytest.mark.parametrize("change, problem", [
    ({"ttft_ms_p90": "slow"}, "'ttft_ms_p90' is 'slow'; expected a finite number or null"),  # a format-code traceback
    ({"met_slo": "no"}, "'met_slo' is 'no'; expected true or false"),  # "no" counted as met
    ({"met_slo": None}, "'met_slo' is None; expected true or false"),
])
def test_bad_probe_figures_are_named_in_one_line(tmp_path, trace, change, problem):
    results = _results(tmp_path, trace, probe={**PROBE, **change})
    done = _run(str(results), "--gpu", "h100")
    assert done.returncode == 2
    assert done.stderr == f"error: {results}: runs.now[0]: {problem}\n"


def test_a_figure_serving_py_left_empty_is_still_read(tmp_path, trace):
    done = _run(str(_results(tmp_path, trace, probe={**PROBE, "tpot_ms_p50": None})), "--gpu", "h100")
    assert done.returncode == 0, done.stderr
    assert "| n/a / " in done.stdout


@pytest.mark.parametrize("given", ["--trace", "results"])
def test_a_json_onto_the_trace_is_refused_and_the_trace_kept(tmp_path, trace, given):
    before = trace.read_bytes()
    args = ["--trace", str(trace)] if given == "--trace" else []
    done = _run(str(_results(tmp_path, trace)), "--gpu", "h100", *args, "--json", str(trace))
    assert done.returncode == 2
    assert done.stderr == f"error: --json {trace} is one of the inputs ({trace}); write elsewhere\n"
    assert trace.read_bytes() == before  # it was replaced by the table's JSON


def test_a_trace_whose_requests_all_arrive_at_once_is_one_line(tmp_path):
    # with_qps' ValueError was a traceback at the first probe
    at_once = write_trace(tmp_path / "t.parquet", [100] * 20, [4] * 20)
    done = _run(str(_results(tmp_path, at_once)), "--gpu", "h100")
    assert done.returncode == 2
    assert done.stderr == (f"error: --trace {at_once}: its first 20 request(s) all arrive at once; expected arrival "
                           "times spread in time, whose gaps each probe rescales to its rate\n")


def test_ctrl_c_in_a_script_is_one_line_and_status_130(capsys):
    def main() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        one_line_script_errors(main)()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted: files finished before it are written, none in part\n"


def test_ctrl_c_during_a_bisection_writes_nothing(tmp_path):
    # a KeyboardInterrupt traceback through the simulator, status -2
    out = tmp_path / "ceiling.json"
    script = REPO / "benchmarks" / "serving_ceiling.py"
    with subprocess.Popen([sys.executable, str(script), "--num-requests", "3000", "--json", str(out)], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as running:
        running.stdout.readline()  # the first model's capacity: two more bisections to go
        running.send_signal(signal.SIGINT)
        _, err = running.communicate(timeout=300)
    assert running.returncode == 130
    assert err == "interrupted: files finished before it are written, none in part\n"
    assert not out.exists()
