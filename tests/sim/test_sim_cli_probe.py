"""Defects found by probing the simulator-side command lines with hostile input (sim.calibrate, sim.replay,
sim.fit_profile): each case failed before its fix."""

from __future__ import annotations

import json

import pytest

from sim.calibrate import main as calibrate_main
from sim.profiled_cost_model import find_profile
from tests.sim.test_calibrate import _fake_run

PROFILE = find_profile("qwen3-0.6b", "h200")


@pytest.mark.parametrize("host", ["gpu-a", ["gpu-a"], 7])
def test_calibrate_takes_a_profile_whose_host_is_not_an_object(tmp_path, capsys, host):
    """A profile whose 'host' was not an object (hand-edited) against a run that recorded its host: calibrate wrote
    the profile, then ended in an AttributeError traceback (exit 1) printing its note about the hosts."""
    run = _fake_run(tmp_path / "run", host=1.2, decode=1.0)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured",
                                                  "config": {"host": {"cpu": "Xeon", "node": "gpu-b"}}}))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({**json.loads(PROFILE.read_text()), "host": host}))
    assert calibrate_main([str(profile), str(run)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and captured.err == ""
    serving = json.loads(profile.read_text())["serving"]
    assert serving["host_factor"] == pytest.approx(1.2, abs=1e-3)
    assert serving["same_host_as_profile"] is None  # the profile's host is not recorded in a form to compare


def test_fit_profile_writes_none_when_a_later_profile_is_bad(tmp_path, capsys):
    """``sim.fit_profile GOOD BAD`` refitted and rewrote GOOD, then exited 2 naming BAD alone."""
    from sim.fit_profile import main as fit_main
    from tests.traces.helpers import cli_error

    good = tmp_path / "good.json"
    good.write_text(json.dumps(json.loads(PROFILE.read_text())))  # on one line: a rewrite changes its bytes
    before = good.read_bytes()
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    line = cli_error(fit_main, [str(good), str(bad)], capsys)
    assert line.startswith(f"error: {bad}: ") and "top level is a JSON array" in line
    assert good.read_bytes() == before, "the good profile was rewritten before the bad one was refused"


def test_fit_profile_of_a_grid_too_small_to_hold_points_out_says_so(tmp_path, capsys):
    """Three points or fewer a family leave none held out: ``sim.fit_profile SMALL FULL`` rewrote SMALL, then ended in
    a TypeError traceback formatting its missing error (exit 1), FULL never refitted."""
    from sim.fit_profile import main as fit_main

    profile = json.loads(PROFILE.read_text())
    counts: dict[str, int] = {}
    points = []
    for point in profile["points"]:
        counts[point["family"]] = counts.get(point["family"], 0) + 1
        if counts[point["family"]] <= 3:
            points.append(point)
    small, full = tmp_path / "small.json", tmp_path / "full.json"
    small.write_text(json.dumps({**profile, "points": points}))
    full.write_text(json.dumps(profile))
    full_before = full.read_bytes()
    assert fit_main([str(small), str(full)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"{small}: {len(points)} points; no held-out points (every family has 3 or fewer; the fit could "
                      "not be checked on points it did not see)")
    assert out[1].startswith(f"{full}: {len(profile['points'])} points; held-out |error| mean ")
    assert json.loads(small.read_text())["fit"]["held_out"]["num_points"] == 0
    assert full.read_bytes() != full_before  # refitted and written too


def test_an_empty_host_slowdown_csv_says_it_is_empty(tmp_path, capsys):
    """An empty --host-slowdown CSV was refused as "got None" (the header it lacked)."""
    from cli.sim_replay import main as replay_main
    from tests.sim.helpers import SHAREGPT
    from tests.traces.helpers import cli_error

    timeline = tmp_path / "host.csv"
    timeline.write_bytes(b"")
    out = tmp_path / "out"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "5", "--quiet", "--host-slowdown", str(timeline),
                                   "--out", str(out)], capsys)
    assert line == f"error: {timeline}: the file is empty; expected a CSV file with the header start_s,slowdown"
    assert not out.exists()


def test_json_inputs_may_start_with_a_byte_order_mark(tmp_path):
    """A profile saved by an editor that writes a BOM: the cost model was refused ("Unexpected UTF-8 BOM"); read
    without the BOM there, the run's warnings and bands re-read it with read_text() and the replay ended in "the
    simulated run cannot be written ... priced beyond any GPU". A JSON input may start with one, as a trace may."""
    import polars as pl

    from cli.sim_replay import main as sim_main
    from traces import save_trace

    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [100, 300],
                             "output_tokens": [4, 8]}), trace)
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    plain.write_bytes(PROFILE.read_bytes())
    marked.write_bytes(b"\xef\xbb\xbf" + PROFILE.read_bytes())
    for profile in (plain, marked):
        assert sim_main([str(trace), "--cost-model", str(profile), "--bands", "2", "--out",
                         str(tmp_path / profile.stem), "--quiet", "--no-report"]) == 0
    summaries = [json.loads((tmp_path / name / "summary.json").read_text()) for name in ("plain", "marked")]
    assert [s["e2e_ms"] for s in summaries][0] == summaries[1]["e2e_ms"]
    assert summaries[0]["bands"]["metrics"] == summaries[1]["bands"]["metrics"]
