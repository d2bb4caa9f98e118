"""Probe D (session 42): a default standing in for a measurement.

Calibrating on runs without decode steps wrote decode factor 1.0 (printing "None of their decode time"), and --add
then averaged that 1.0 into the profile's decode factor as if a machine had measured it; the same held for a device
factor the runs could not tell (1.0), a decode factor after a prefill or a finish with too few such steps (1.0), and
a host episode ratio of a session that saw no slow windows (1.0). Expected: a session records which factors it
measured ("measured"), --add averages each factor over the sessions that measured it (older sessions, without the
record, count as measured), a factor these runs did not measure is the grid's 1.0 and said so, and runs that measure
nothing are refused in one line naming them.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sim.calibrate import MIN_BUCKET_STEPS, MIN_RUN_STEPS, calibrate, with_sessions
from sim.calibrate import main as calibrate_main
from sim.profiled_cost_model import ProfiledCostModel, read_profile
from tests.sim.test_calibrate import PROFILE, _fake_run, _mixed_run
from tests.sim.test_probe_session26_o import _decode, _grid, _prefill, _run


def _eager_only(path, host: float, num_steps: int = 30):
    """A run of prefills alone, each at ``host`` x the grid's host part."""
    grid = _grid()
    steps = []
    for i in range(num_steps):
        f = _prefill(64 + 32 * (i % 3))
        floor_s, gpu_s = grid.eager_parts(f)
        steps.append((f, float(grid.combine(host * floor_s, gpu_s))))
    return _run(path, steps)


def _decode_only(path, decode: float, num_steps: int = 40):
    """A run of decode steps alone (none repeats its batch), each at ``decode`` x the grid."""
    grid = _grid()
    steps = [(f, decode * grid.predict(f, host_slowdown=1.0)) for f in (_decode(32, 700 + i, 0)
                                                                        for i in range(num_steps))]
    return _run(path, steps)


def _profile(tmp_path):
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    return profile


def test_runs_without_decode_steps_measure_no_decode_factor_and_say_so(tmp_path, capsys):
    profile = _profile(tmp_path)
    assert calibrate_main([str(profile), str(_eager_only(tmp_path / "prefills", host=1.2))]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert serving["measured"] == ["host_factor"]
    assert serving["host_factor"] == pytest.approx(1.2, abs=1e-3)
    assert serving["decode_factor"] == 1.0 and serving["num_decode_steps"] == 0
    assert serving["decode_time_ratio_uncalibrated"] is None and "repeat_decode_factor" not in serving
    out = capsys.readouterr().out
    assert ("decode factor 1.0 (not measured: 0 CUDA-graph decode steps, fewer than 10), from prefills (the grid "
            "model gave ") in out
    assert "None" not in out and out.endswith("of their eager time)\nnote: the runs measured no decode factor: the "
                                              "profile prices those steps at the grid's time (factor 1.0); calibrate "
                                              "with --add to keep an earlier calibration's and add these runs to it\n")


def test_add_averages_the_decode_factor_over_the_sessions_that_measured_it(tmp_path, capsys):
    profile = _profile(tmp_path)
    assert calibrate_main([str(profile), str(_fake_run(tmp_path / "both", host=0.8, decode=0.97))]) == 0
    first = json.loads(profile.read_text())["serving"]
    assert first["measured"] == ["host_factor", "decode_factor", "repeat_decode_factor"]
    capsys.readouterr()
    assert calibrate_main([str(profile), str(_eager_only(tmp_path / "prefills", host=1.2)), "--add"]) == 0
    serving = json.loads(profile.read_text())["serving"]
    # Before: decode factor (0.97 + 1.0) / 2, its range 0.97-1.0, and host_share from a slope through that 1.0.
    assert serving["decode_factor"] == first["decode_factor"] == pytest.approx(0.97, abs=1e-3)
    assert serving["decode_factor_range"] == [first["decode_factor"], first["decode_factor"]]
    assert "host_share" not in serving  # one session measured both: no slope to take
    assert serving["host_factor"] == pytest.approx(1.0, abs=1e-3)
    assert serving["host_factor_range"] == pytest.approx([0.8, 1.2], abs=1e-3)
    assert serving["measured"] == ["host_factor", "decode_factor", "repeat_decode_factor"]
    assert serving["sessions"][1]["measured"] == ["host_factor"]
    assert ProfiledCostModel.load(profile).decode_factor == first["decode_factor"]
    assert ("(the means of the sessions that measured each: host 2, device 0, decode 1 of 2; the grid's 1.0 where "
            "none did)") in capsys.readouterr().out


def test_decode_only_runs_calibrate_the_decode_factor_and_leave_the_host_factor_to_the_others(tmp_path, capsys):
    profile = _profile(tmp_path)
    assert calibrate_main([str(profile), str(_fake_run(tmp_path / "both", host=0.8, decode=0.97))]) == 0
    first = json.loads(profile.read_text())["serving"]
    capsys.readouterr()
    assert calibrate_main([str(profile), str(_decode_only(tmp_path / "decodes", decode=1.07)), "--add"]) == 0
    out = capsys.readouterr().out
    assert ("host factor 1.0 (not measured: 0 eager steps, fewer than 10), decode factor 1.07, "
            "from decodes (the grid model gave 0.9346 of their decode time)") in out
    serving = json.loads(profile.read_text())["serving"]
    assert serving["sessions"][1]["measured"] == ["decode_factor", "repeat_decode_factor"]
    assert serving["host_factor"] == first["host_factor"] and serving["host_factor_range"] == [first["host_factor"]] * 2
    assert serving["decode_factor"] == round((first["decode_factor"] + 1.07) / 2, 4)
    assert serving["num_eager_steps"] == 30


def test_a_device_factor_the_runs_could_not_tell_is_left_out_of_the_mean(tmp_path):
    profile = _profile(tmp_path)
    assert calibrate_main([str(profile), str(_fake_run(tmp_path / "host-bound", host=0.8, decode=0.97))]) == 0
    assert "device_factor" not in json.loads(profile.read_text())["serving"]["measured"]
    assert calibrate_main([str(profile), str(_mixed_run(tmp_path / "mixed", host=1.2, device=0.9)), "--add"]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert serving["sessions"][1]["device_factor"] == pytest.approx(0.9, abs=1e-3)
    assert serving["device_factor"] == serving["sessions"][1]["device_factor"]  # before: (1.0 + 0.9) / 2


def test_too_few_steps_after_a_prefill_leave_the_decode_factor_unmeasured_beside_the_extras(tmp_path, capsys):
    """Extras measured, but fewer than MIN_BUCKET_STEPS decode steps after a prefill or a finish: the repeating steps'
    price is measured (the grid plus the extras), the others' factor is not."""
    grid = _grid()
    steps = []
    for i in range(2 * MIN_BUCKET_STEPS):
        repeat = _decode(40, 700 + 5 * i, 1)
        steps.append((repeat, grid.predict(repeat, host_slowdown=1.0) + 3e-4))
        prefill = _prefill(256)
        steps.append((prefill, float(grid.combine(*grid.eager_parts(prefill)))))
    serving = calibrate(read_profile(PROFILE), [_run(tmp_path / "run", steps)])
    assert serving["measured"] == ["host_factor", "repeat_decode_factor"]
    assert serving["decode_factor"] == 1.0 and serving["repeat_decode_factor"] == 1.0
    measured = {**serving, "decode_factor": 1.1, "measured": ["host_factor", "decode_factor"]}
    assert with_sessions(measured, serving)["decode_factor"] == 1.1  # before: 1.05
    profile = _profile(tmp_path)
    assert calibrate_main([str(profile), str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert ("decode factor 1.0 (not measured: fewer than 50 decode steps after a prefill or a finish; repeating "
            "steps: the grid plus their extras), from run (") in out
    assert "\nnote: the runs measured no decode factor: the profile prices those steps at the grid's time" in out


def test_runs_that_measure_nothing_are_refused_in_one_line(tmp_path, capsys):
    grid = _grid()
    prefill, decode = _prefill(128), _decode(16, 500, 0)
    steps = [(prefill, float(grid.combine(*grid.eager_parts(prefill))))] * 5
    steps += [(decode, grid.predict(decode, host_slowdown=1.0))] * 5
    run = _run(tmp_path / "run", steps)
    profile = _profile(tmp_path)
    before = profile.read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        calibrate_main([str(profile), str(run), "--add"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: {run}: nothing to calibrate on: 5 eager steps (with a prefill) and 5 "
                                       f"CUDA-graph decode steps; expected at least {MIN_RUN_STEPS} of either\n")
    assert profile.read_bytes() == before


def test_sessions_without_the_record_count_as_measured():
    """The shipped profiles' sessions (calibrated before the record) are averaged as they were."""
    serving = read_profile(PROFILE)["serving"]
    new = {"host_factor": 1.5, "decode_factor": 1.5, "measured": ["host_factor", "decode_factor"]}
    merged = with_sessions(serving, new)
    hosts = [s["host_factor"] for s in serving["sessions"]] + [1.5]
    decodes = [s["decode_factor"] for s in serving["sessions"]] + [1.5]
    assert merged["host_factor"] == round(sum(hosts) / len(hosts), 4)
    assert merged["decode_factor"] == round(sum(decodes) / len(decodes), 4)
    devices = [s["device_factor"] for s in serving["sessions"]]  # the new session measured none
    assert merged["device_factor"] == round(sum(devices) / len(devices), 4)


def test_episode_ratios_come_from_the_sessions_that_saw_slow_windows():
    slow = {"host_factor": 1.0, "decode_factor": 1.0, "host_episodes": {
        "slow_over_normal": 1.3, "slow_share_range": [0.05, 0.05], "mean_episode_s": 4.0, "num_windows": 40}}
    steady = {"host_factor": 1.0, "decode_factor": 1.0, "host_episodes": {
        "slow_over_normal": 1.0, "slow_share_range": [0.0, 0.0], "mean_episode_s": 2.0, "num_windows": 50}}
    episodes = with_sessions(slow, steady)["host_episodes"]
    assert episodes == {"slow_over_normal": 1.3, "slow_share_range": [0.0, 0.05], "mean_episode_s": 4.0,
                        "num_windows": 90}  # before: 1.15 and 3.0 s
    assert with_sessions(steady, steady)["host_episodes"]["slow_over_normal"] == 1.0


def test_a_profile_whose_measured_record_is_not_a_list_of_factors_is_refused(tmp_path, capsys):
    profile = json.loads(PROFILE.read_text())
    profile["serving"]["sessions"][0]["measured"] = "host_factor"  # --add averages each factor over these
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(SystemExit) as exit_info:
        calibrate_main([str(path), str(_fake_run(tmp_path / "run", host=1.0, decode=1.0)), "--add"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: {path}: field 'serving.sessions[0].measured' is host_factor; "
                                       "expected a list of the factors the runs measured, of host_factor, "
                                       "device_factor, decode_factor, repeat_decode_factor\n")
