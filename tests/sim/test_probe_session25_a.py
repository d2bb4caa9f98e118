"""Session 25, probe A: hostile step logs and profiles given to sim.calibrate and sim.host_speed. Each test failed
before its fix, bar the one that checks two replicas' steps of one number are still taken."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.calibrate import main as calibrate_main
from sim.host_speed import main as host_speed_main
from sim.profiled_cost_model import find_profile
from tests.sim.test_calibrate import _fake_run
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")


def _with_a_step_given_twice(path):
    """A GPU-run folder whose step log holds its step 12 a second time, after its last step."""
    run = _fake_run(path, host=1.2, decode=1.05)
    steps = pq.read_table(run / "steps.parquet")
    pq.write_table(pa.concat_tables([steps, steps.slice(12, 1)]), run / "steps.parquet")
    return run, steps.num_rows


def test_calibrate_refuses_a_step_given_twice(tmp_path, capsys):
    """The repeated row was calibrated on at exit 0 (its time weighted double, 'num_steps' one too many);
    analysis.summarize and analysis.compare refuse the same log."""
    run, rows = _with_a_step_given_twice(tmp_path / "run")
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    line = cli_error(calibrate_main, [str(profile), str(run)], capsys)
    assert line == (f"error: {run}/steps.parquet: row {rows}: column 'step' is 12; expected one row per step of a "
                    "replica (replica 0, step 12 is also at row 12)")
    assert profile.read_bytes() == PROFILE.read_bytes()


def test_host_speed_refuses_a_step_given_twice(tmp_path, capsys):
    run, rows = _with_a_step_given_twice(tmp_path / "run")
    out = tmp_path / "h.csv"
    line = cli_error(host_speed_main, [str(run), "--profile", str(PROFILE), "--out", str(out)], capsys)
    assert line.endswith(f"{run}/steps.parquet: row {rows}: column 'step' is 12; expected one row per step of a "
                         "replica (replica 0, step 12 is also at row 12)")
    assert not out.exists()


def test_calibrate_takes_the_same_step_number_on_two_replicas(tmp_path, capsys):
    """Each replica numbers its own steps: step 3 of replica 0 and step 3 of replica 1 are two steps."""
    run = _fake_run(tmp_path / "run", host=1.2, decode=1.05)
    steps = pq.read_table(run / "steps.parquet")
    half = steps.num_rows // 2
    replica = pa.array([0] * half + [1] * (steps.num_rows - half), pa.int64())
    step = pa.array(list(range(half)) + list(range(steps.num_rows - half)), pa.int64())
    steps = steps.set_column(steps.column_names.index("replica"), "replica", replica)
    steps = steps.set_column(steps.column_names.index("step"), "step", step)
    pq.write_table(steps, run / "steps.parquet")
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    assert calibrate_main([str(profile), str(run)]) == 0


def _profile_with_sessions_edited(tmp_path, edit):
    """The shipped profile (three machine sessions) with ``edit`` applied to both copies of its calibration."""
    data = json.loads(PROFILE.read_text())
    for serving in (data["serving"], data["fit"]["serving"]):
        edit(serving["sessions"][0])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("value", "shown"), [("7", "7"), (None, "None"), ([3], "[3]"), (float("nan"), "nan")])
def test_calibrate_add_refuses_a_sessions_window_count_of_another_type(tmp_path, capsys, value, shown):
    """--add sums the sessions' host_episodes.num_windows: text, null or a list was a TypeError traceback (exit 1)
    after the runs were read, NaN the line 'error: cannot convert float NaN to integer' that named no file."""
    profile = _profile_with_sessions_edited(tmp_path, lambda s: s["host_episodes"].update(num_windows=value))
    before = profile.read_bytes()
    run = _fake_run(tmp_path / "run", host=1.2, decode=1.05)
    line = cli_error(calibrate_main, [str(profile), str(run), "--add"], capsys)
    assert line == (f"error: {profile}: field 'serving.sessions[0].host_episodes.num_windows' is {shown}; expected "
                    "a number of windows (an integer >= 0)")
    assert profile.read_bytes() == before


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("run", ["cal-azure"], "field 'serving.sessions[0].runs[0].run' is ['cal-azure']; expected the run's folder "
                           "name, a string"),
    ("num_steps", [18282], "field 'serving.sessions[0].runs[0].num_steps' is [18282]; expected the run's step "
                           "count, an integer >= 0"),
])
def test_calibrate_add_refuses_a_sessions_run_it_cannot_compare(tmp_path, capsys, field, value, expected):
    """--add looks for the runs it adds among the sessions' (by name, step count and host): a list there was a
    TypeError traceback ('unhashable type: list', exit 1) after the runs were read."""
    profile = _profile_with_sessions_edited(tmp_path, lambda s: s["runs"][0].update({field: value}))
    before = profile.read_bytes()
    run = _fake_run(tmp_path / "run", host=1.2, decode=1.05)
    assert cli_error(calibrate_main, [str(profile), str(run), "--add"], capsys) == f"error: {profile}: {expected}"
    assert profile.read_bytes() == before
