"""Session 24, probe K: hostile input to the decode extras (serving.decode_extra_s, sim.calibrate) and Ctrl-C once
sim.replay's outputs are complete: tracebacks, unreadable messages, cut values that did not say so, a status 130
with no line over a complete output folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.sim_replay import main as replay_main
from sim.calibrate import main as calibrate_main
from sim.profiled_cost_model import ProfiledCostModel, check_fit, find_profile, fit_profile, read_profile
from tests.sim.helpers import SHAREGPT
from tests.sim.test_decode_extras import _decode_features, _run
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _grid_run(path: Path, extra_s: float = 0.0, num_steps: int = 60) -> Path:
    """A GPU run of 40-row decode steps that repeat their batch, at the grid's price plus ``extra_s``, and a prefill
    after each (the host factor needs eager steps)."""
    profile = read_profile(PROFILE)
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    steps = []
    for i in range(num_steps):
        f = _decode_features(40, 900 + i, 1)
        steps.append((f, grid.predict(f, host_slowdown=1.0) + extra_s))
        prefill = {**_decode_features(0, 0, 0), "num_seqs": 1, "num_prefill_seqs": 1, "num_prefill_tokens": 256,
                   "prefill_attention_pairs": 256 * 257 // 2}
        floor, gpu = grid.eager_parts(prefill)
        steps.append((prefill, float(grid.combine(floor, gpu))))
    return _run(path, steps)


def _edited_profile(tmp_path: Path, edit) -> Path:
    data = json.loads(PROFILE.read_text())
    for block in (data["serving"], data["fit"]["serving"]):
        edit(block)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("num_steps", "shown"), [(7, "7"), (["a"] * 20, str(["a"] * 20)[:77] + "..."),
                                                  ([float("nan")] * 20, str([float("nan")] * 20)[:77] + "...")])
def test_a_sessions_extra_step_counts_of_another_type_are_refused_before_add(tmp_path, capsys, num_steps, shown):
    """--add sums each session's num_steps per bucket: 7 and ['a', ...] were TypeError tracebacks (exit 1), NaN the
    line 'cannot convert float NaN to integer', after the runs had been read; the profile loaded without a word."""
    path = _edited_profile(tmp_path, lambda s: s["sessions"][0]["decode_extra_s"].__setitem__("num_steps", num_steps))
    before = path.read_bytes()
    run = _grid_run(tmp_path / "run")
    line = cli_error(calibrate_main, [str(path), str(run), "--add"], capsys)
    assert line == (f"error: {path}: field 'serving.sessions[0].decode_extra_s.num_steps' is {shown}; expected one "
                    "step count (an integer >= 0) per batch size (20)")
    assert path.read_bytes() == before


def test_extras_batch_sizes_beyond_any_graph_are_refused_at_load(tmp_path, capsys):
    """Sizes are bounded as the graphs are: a list of 200,000 took 8 s to load (each batch size read it anew), and
    sim.calibrate --add's merge grew with its square."""
    path = _edited_profile(tmp_path, lambda s: s["decode_extra_s"].update(batch_sizes=[1, 2**16 + 1],
                                                                           extra_s=[0.0, 1e-4], num_steps=[0, 60]))
    out = tmp_path / "run"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "3", "--cost-model", str(path), "--out", str(out),
                                   "--quiet", "--no-report"], capsys)
    assert line == (f"error: cost model {path}: not a readable profile (field 'serving.decode_extra_s.batch_sizes' "
                    "is [1, 65537]; expected increasing batch sizes from 1 to 65536)")
    assert not out.exists()


def test_the_two_calibrations_differing_in_one_extra_are_told_apart():
    """fit.serving's extra at batch size 8 changed by hand: both objects were quoted, cut at the same 40 characters,
    and the message showed the same text twice."""
    profile = read_profile(PROFILE)
    profile["serving"]["decode_extra_s"]["extra_s"][3] = 1e-4
    profile["fit"]["serving"] = json.loads(json.dumps(profile["serving"]))
    profile["fit"]["serving"]["decode_extra_s"]["extra_s"][3] = 2e-4
    with pytest.raises(ValueError) as error:
        check_fit(profile)
    assert str(error.value) == ("field 'serving.decode_extra_s.extra_s[3]' is 0.0001 but field "
                                "'fit.serving.decode_extra_s.extra_s[3]' is 0.0002; expected one calibration in both "
                                "(sim.calibrate writes the same to each, and python -m sim.fit_profile copies "
                                "'serving' into 'fit')")


def test_a_cut_value_says_it_was_cut():
    """Values were cut at 80 characters with no sign: the part shown could read as the whole list."""
    profile = read_profile(PROFILE)
    sizes = list(range(1, 41)) + [40]
    profile["fit"]["graph_decode"]["batch_sizes"] = sizes
    with pytest.raises(ValueError) as error:
        check_fit(profile)
    assert str(error.value) == (f"field 'fit.graph_decode.batch_sizes' is {str(sizes)[:77]}...; expected an "
                                "increasing list of batch sizes >= 1")


def test_an_extra_held_at_its_bound_is_warned_of(tmp_path, capsys):
    """Decode steps 50 s beyond the grid: the extra was written at its bound, 1 s a step, without a word."""
    path = tmp_path / "profile.json"
    path.write_bytes(PROFILE.read_bytes())
    assert calibrate_main([str(path), str(_grid_run(tmp_path / "run", extra_s=50.0))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("warning: the decode extra of graph batch size 48 is at its bound (1 s a step): the runs' decode steps "
            "lie beyond it; check that the runs are of this profile's deployment") in lines
    assert json.loads(path.read_text())["serving"]["decode_extra_s"]["extra_s"][6] == 1.0


# sim.replay run as python -m runs it, with an exit handler registered before its imports: it runs last, as the
# interpreter shuts down once main has returned, and sends the signal then.
_SIGNAL_AT_EXIT = """
import atexit, os, runpy, signal, sys, time

SIGNUM = getattr(signal, sys.argv[1])

def signal_at_exit():
    os.kill(os.getpid(), SIGNUM)
    time.sleep(2)

atexit.register(signal_at_exit)
sys.argv = ["-m", *sys.argv[2:]]
runpy.run_module("sim.replay", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_outputs_are_complete_leaves_the_status_alone(tmp_path, signame):
    """Ctrl-C as the interpreter shut down after a finished replay: status 130 and no line, or 'Exception ignored in
    atexit callback' and a KeyboardInterrupt traceback, over a complete output folder."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT_EXIT, signame, str(SHAREGPT), "--limit", "3", "--out",
                           str(out), "--quiet", "--no-report"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "")
    assert (out / "summary.json").is_file()


def test_ctrl_c_while_the_summary_prints_says_the_outputs_are_complete(tmp_path, capsys, monkeypatch):
    """The outputs were in place and the line said 'interrupted: nothing written'."""
    import cli.sim_replay

    def interrupted(summary):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.sim_replay, "format_summary_table", interrupted)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        replay_main([str(SHAREGPT), "--limit", "3", "--out", str(out), "--no-report"])
    assert stop.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == (f"interrupted: the outputs in {out}/ are complete; only this "
                                                        "summary was cut")
    assert (out / "summary.json").is_file()
