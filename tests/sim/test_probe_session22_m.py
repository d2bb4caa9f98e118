"""Session 22, probe M: hostile profiles and run folders for sim.fit_profile, sim.calibrate and sim.host_speed.
Each test failed before its fix: an unloadable profile written at exit 0, a traceback, numpy's words for an error,
a misleading line, a simulated run read as a GPU's, or a run counted twice."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from sim.calibrate import main as calibrate_main
from sim.fit_profile import main as fit_main
from sim.host_episodes import fit_host_episodes
from sim.host_speed import main as host_speed_main
from sim.profiled_cost_model import ProfiledCostModel, find_profile
from tests.sim.test_calibrate import _fake_run, _mixed_run
from tests.sim.test_tools_hostile import _profile, _repeated, _run_with
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")


def _steep_decode(data):
    """Decode points whose time grows faster than in proportion to the context: a line through them crosses 0 s
    above a context of 0."""
    for point in data["points"]:
        if point["family"] == "decode":
            context = point["features"]["decode_context_tokens"]
            point["median_s"] = max(1e-6, 1e-7 * context - 0.001) if context > 20000 else 1e-6
            point.pop("times_s", None)
    return data


def test_fit_profile_never_writes_a_negative_decode_intercept(tmp_path, capsys):
    """Written at exit 0 with intercepts down to -0.9 ms; every sim.replay then refused the profile."""
    path = _profile(tmp_path, _steep_decode)
    assert fit_main([str(path)]) == 0
    model = ProfiledCostModel.load(path)  # raised: 'fit.graph_decode.intercept_s' ... expected >= 0
    decode = model.fit["graph_decode"]
    assert min(decode["intercept_s"]) >= 0 and min(decode["per_kv_token_s"]) >= 0


def test_huge_cuda_graph_sizes_are_one_line_not_a_memory_error(tmp_path, capsys):
    """cuda_graph_sizes [1, 2**40] was a MemoryError traceback in sim.fit_profile and sim.calibrate."""
    def huge(data):
        data["engine_options"]["cuda_graph_sizes"] = [1, 2**40]
        return data
    path = _profile(tmp_path, huge)
    before = path.read_bytes()
    expected = (f"error: {path}: field 'engine_options.cuda_graph_sizes' is [1, 1099511627776]; expected an "
                "increasing list of sizes from 1 to 65536")
    assert cli_error(fit_main, [str(path)], capsys) == expected
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    assert cli_error(calibrate_main, [str(path), str(run)], capsys) == expected
    assert path.read_bytes() == before


def test_host_episodes_of_a_run_without_a_normal_speed_are_skipped():
    """Most windows' host-bound steps took no time beyond their device part (host time 0): the slow windows were
    divided by a normal speed of 0, a ZeroDivisionError traceback from sim.calibrate."""
    steps = [(0.0 if w < 7 else 1.0, 1.0, 2.0 * w + 0.1 * i) for w in range(12) for i in range(3)]
    assert fit_host_episodes([steps]) is None


def test_a_max_form_grid_with_one_eager_point_fits(tmp_path, capsys):
    """An eager (max form) fit whose device regime held none of the points was refused with numpy's 'zero-size
    array to reduction operation maximum which has no identity', which said nothing of the profile."""
    def one_eager(data):
        data["engine_options"].pop("piecewise_graph_sizes")
        eager = next(p for p in data["points"] if p["family"] == "prefill")
        data["points"] = [p for p in data["points"] if p["family"] == "decode"] + [eager]
        return data
    path = _profile(tmp_path, one_eager)
    assert fit_main([str(path)]) == 0
    data = json.loads(path.read_text())
    model = ProfiledCostModel.load(path)
    eager = data["points"][-1]
    assert data["fit"]["eager"]["form"] == "max"
    assert model.predict(eager["features"], host_slowdown=1.0) == pytest.approx(eager["median_s"], rel=1e-9)


def test_calibrate_says_why_no_device_factor_was_fitted(tmp_path, capsys):
    """Runs of short and long prompts (host shares spread 0.4) whose device time is 3x the grid's: the pair left its
    bounds and the host factor alone was fitted, and the line said the shares spread '0.40, under 0.2'."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _mixed_run(tmp_path / "run", host=1.0, device=3.0)
    assert calibrate_main([str(profile), str(run)]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert serving["device_factor"] == 1.0 and serving["eager_host_share_spread"] >= 0.2
    out = capsys.readouterr().out
    assert "under 0.2" not in out
    assert ("(no device factor: the host and device pair these runs fit lies outside host 0.25-4 and device 0.5-2; "
            "the host factor alone is fitted)") in out


def test_calibrate_warns_when_a_factor_is_at_its_bound(tmp_path, capsys):
    """Runs 10x faster than the grid were written as host factor 0.25 and decode factor 0.5 (the clamps) with no
    word that the runs lay beyond them."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=0.1, decode=0.1)
    assert calibrate_main([str(profile), str(run)]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert (serving["host_factor"], serving["decode_factor"]) == (0.25, 0.5)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: host factor 0.25 is at its bound (0.25-4): the runs' steps lie beyond it, and the profile prices "
        "them at the bound; check that the runs are of this profile's deployment",
        "warning: decode factor 0.5 is at its bound (0.5-2): the runs' steps lie beyond it, and the profile prices "
        "them at the bound; check that the runs are of this profile's deployment",
    ]


def test_calibrate_refuses_a_copy_of_a_run_given_beside_it(tmp_path, capsys):
    """The same steps.parquet in two folders counted twice (a run given twice by one name is refused)."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    before = profile.read_bytes()
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    assert cli_error(calibrate_main, [str(profile), str(run), str(copy)], capsys) == (
        f"error: run folder {copy} holds the same steps.parquet as {run}; give each run once")
    assert profile.read_bytes() == before


def test_calibrate_records_a_run_given_as_dot_by_its_folder_name(tmp_path, monkeypatch, capsys):
    """Given as '.', a run was recorded (and printed) with the name ''."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    monkeypatch.chdir(run)
    assert calibrate_main([str(profile), "."]) == 0
    assert [r["run"] for r in json.loads(profile.read_text())["serving"]["runs"]] == ["run"]
    assert ", from run (the grid model gave" in capsys.readouterr().out


def test_host_speed_refuses_a_run_without_a_summary(tmp_path, capsys):
    """A simulated run whose summary.json was removed gave a timeline of the cost model's host slowdown at exit 0;
    sim.calibrate refuses the same folder."""
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").unlink()  # _fake_run writes a GPU run's
    out = tmp_path / "h.csv"
    expected = (f"error: run folder {run} has no readable summary.json; expected an engine.replay output folder (its "
                "summary.json tells a GPU run from a simulation)")
    assert cli_error(host_speed_main, [str(run), "--profile", str(PROFILE), "--out", str(out)], capsys) == expected
    assert not out.exists()
    assert pq.read_metadata(run / "steps.parquet").num_rows > 0  # the run itself is untouched and readable
