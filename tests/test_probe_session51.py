"""Session 51: a run folder whose summary.json is of another kind than engine.replay's was read as a GPU run.

sim.run_kind refused a simulation (a profile's or the roofline's cost model), a client-timed run and a folder with no
summary.json; any other summary.json (another tool's, one with no cost_model, one edited by hand) passed, and its
steps judged the cost model at exit 0. A GPU run is now one whose summary.json says engine.replay's "measured".
"""

from __future__ import annotations

import json

import pytest

from sim.run_kind import MEASURED, gpu_run_problem
from tests.test_probe_session50_B import PROFILE, _gpu_run, _one_line, _script


@pytest.mark.parametrize(("summary", "named"), [
    ({"cost_model": "capacity sweep"}, "'capacity sweep'"),
    ({"qps": 3.0, "ttft_ms": {"p90": 2.0}}, "None"),  # no cost_model at all
    ({"cost_model": "Measured"}, "'Measured'"),
])
def test_step_errors_refuses_a_summary_of_another_kind(tmp_path, summary, named):
    run = _gpu_run(tmp_path / "run", 4)
    (run / "summary.json").write_text(json.dumps(summary))
    line = _one_line(_script("step_errors", "--profile", str(PROFILE), str(run)))
    assert line.startswith(f"error: run folder {run}: its summary.json names cost model {named}, not "
                           f"engine.replay's 'measured'; "), line


def test_an_engine_replay_summary_is_a_gpu_run(tmp_path):
    run = _gpu_run(tmp_path / "run", 4)
    assert json.loads((run / "summary.json").read_text())["cost_model"] == MEASURED
    assert gpu_run_problem(run) is None
    done = _script("step_errors", "--profile", str(PROFILE), str(run))
    assert done.returncode == 0, done.stderr
