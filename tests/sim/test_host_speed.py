"""Host-slowdown processes, the cost models' use of them, and the timeline read off a replay."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.records import STEP_COLUMNS
from sim.host_speed import (
    FORGET_PERIODS,
    MAX_CYCLES_DRAWN,
    ConstantHostSpeed,
    HostSpeedEpisodes,
    HostSpeedTimeline,
    parse_host_slowdown,
    timeline_from_run,
)
from sim.profiled_cost_model import ProfiledCostModel, find_profile

STEP_INT_COLUMNS = [c.name for c in STEP_COLUMNS if c.dtype == "int64"]
PROFILE = find_profile("qwen3-0.6b", "h200")


def test_timeline_holds_each_value_until_the_next_start(tmp_path):
    t = HostSpeedTimeline([0.0, 2.0, 5.0], [1.0, 1.8, 1.2])
    assert [t.slowdown_at(x) for x in (-1.0, 0.0, 1.99, 2.0, 4.9, 5.0, 99.0)] == [1.0, 1.0, 1.0, 1.8, 1.8, 1.2, 1.2]
    t.write_csv(tmp_path / "h.csv")
    again = HostSpeedTimeline.load_csv(tmp_path / "h.csv")
    assert again.starts_s == [0.0, 2.0, 5.0] and again.slowdowns == [1.0, 1.8, 1.2]


def test_a_timeline_exported_with_a_byte_order_mark_is_read(tmp_path):
    """A spreadsheet's CSV export starts with a BOM: its header read '\\ufeffstart_s' and the file was refused."""
    path = tmp_path / "exported.csv"
    path.write_bytes(b"\xef\xbb\xbfstart_s,slowdown\r\n0,1.2\r\n5,1.4\r\n")
    timeline = HostSpeedTimeline.load_csv(path)
    assert (timeline.starts_s, timeline.slowdowns) == ([0.0, 5.0], [1.2, 1.4])


@pytest.mark.parametrize("text,message", [
    ("start_s,slowdown\n0,1\n0,2\n", "increase"),
    ("start_s,slowdown\n0,-1\n", "from 0.001 to 1000, got -1"),
    ("start_s,slowdown\n0,1\n5,5000\n", "from 0.001 to 1000, got 5000"),  # overflowed the run's sums at 1e308
    ("start_s,slowdown\n0,x\n", "line 2"),
    ("start_s,slowdown\n", "at least one"),
])
def test_bad_timeline_files_say_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        HostSpeedTimeline.load_csv(path)
    assert "bad.csv" in str(info.value)


def test_episodes_are_seeded_and_spend_about_the_asked_share_slow():
    a = HostSpeedEpisodes(1.1, 1.8, 0.25, 4.0, seed=3)
    b = HostSpeedEpisodes(1.1, 1.8, 0.25, 4.0, seed=3)
    times = np.arange(0.0, 20000.0, 0.5)
    values = [a.slowdown_at(t) for t in times]
    assert values == [b.slowdown_at(t) for t in times]
    assert set(values) == {1.1, 1.8}
    assert abs(np.mean(np.array(values) == 1.8) - 0.25) < 0.03
    # a slow episode lasts 4 s on average: count the switches into slow
    starts = sum(1 for x, y in zip(values, values[1:]) if x == 1.1 and y == 1.8)
    assert 3.0 < 0.25 * 20000.0 / starts < 5.0
    assert HostSpeedEpisodes(1.0, 2.0, 0.0, 1.0).slowdown_at(123.0) == 1.0


def test_episodes_are_slow_the_asked_share_of_a_short_run_too():
    """The process started in a normal period, whose mean is 4 s here (12 s at the bands' default 25 %): a 2-s run at
    episodes:1,3,0.5,4 averaged 1.39x over seeds instead of 2x, so short replays and their --bands ran fast. It now
    starts slow with probability FRACTION, as a host found mid-run is."""
    seeds = range(1000)
    slow_at_start = sum(HostSpeedEpisodes(1.0, 3.0, 0.5, 4.0, seed).slowdown_at(0.0) == 3.0 for seed in seeds)
    assert 450 < slow_at_start < 550  # was 0
    means = [np.mean([h.slowdown_at(t) for t in np.linspace(0.0, 2.0, 21)])
             for h in (HostSpeedEpisodes(1.0, 3.0, 0.5, 4.0, seed) for seed in seeds)]
    assert abs(np.mean(means) - 2.0) < 0.1  # was 1.39
    assert all(HostSpeedEpisodes(1.0, 3.0, 0.0, 4.0, seed).slowdown_at(0.0) == 1.0 for seed in range(50))


def test_after_a_gap_too_long_to_draw_the_process_restarts_slow_only_as_often_as_it_is_slow():
    """A gap of over MAX_CYCLES_DRAWN episode cycles is not drawn: the process restarts at its end. The restart was
    always in a slow period, so a trace of Unix timestamps (first arrival ~1.7e9 s) always began slow."""
    at_restart = [HostSpeedEpisodes(1.0, 3.0, 0.25, 4.0, seed).slowdown_at(1.7e9) for seed in range(1000)]
    assert 200 < at_restart.count(3.0) < 300  # was all 1000
    process = HostSpeedEpisodes(1.0, 3.0, 0.25, 4.0, seed=1)
    values = [process.slowdown_at(t) for t in np.arange(1.7e9, 1.7e9 + 20000.0, 0.5)]
    assert abs(np.mean(np.array(values) == 3.0) - 0.25) < 0.03  # and the share holds after it


def test_episodes_end_in_bounded_time():
    """Episodes of 1e-300 s, or a query at 1e300 s (a trace's last arrival), drew periods forever."""
    with pytest.raises(ValueError, match="MEAN_S >= 0.001 s; got 1.0, 2.0, 0.5, 1e-300"):
        parse_host_slowdown("episodes:1,2,0.5,1e-300")
    episodes = HostSpeedEpisodes(1.0, 2.0, 0.5, 1.0, seed=1)
    assert episodes.slowdown_at(10.0) in (1.0, 2.0)
    assert episodes.slowdown_at(1e300) in (1.0, 2.0) and episodes.slowdown_at(1e300 * 1.5) in (1.0, 2.0)
    assert len(episodes._ends_s) < 1000


def test_short_episodes_over_long_gaps_take_bounded_time_and_memory():
    """At MEAN_S 0.001 each idle gap of 2,000 s drew two million periods, and every period drawn was kept: 20 requests
    that far apart took 10 s and 640 MB, sharegpt's 2,000 hours. A gap of 100 cycles now restarts the process, and
    the periods the clock has passed are forgotten; the slow share holds."""
    process = HostSpeedEpisodes(1.0, 2.0, 0.5, 0.001, seed=1)
    for t_s in np.arange(0.0, 2000.0 * 2000, 2000.0):  # idle gaps: at most 2 * MAX_CYCLES_DRAWN periods each
        process.slowdown_at(t_s)
        process.forget_before(t_s)
    assert len(process._ends_s) < FORGET_PERIODS + 2 * MAX_CYCLES_DRAWN + 4
    values = []
    for t_s in np.arange(4e6, 4e6 + 100.0, 0.005):  # busy: a step every 5 ms, some 100,000 periods drawn
        process.forget_before(t_s)
        values.append(process.slowdown_at(t_s))
    assert len(process._ends_s) < FORGET_PERIODS + 20
    assert abs(np.mean(np.array(values) == 2.0) - 0.5) < 0.02


def test_forgetting_never_changes_a_later_slowdown():
    """Periods are dropped in pairs: the slowdown at any time from the clock on is the one drawn without forgetting."""
    kept, forgetting = HostSpeedEpisodes(1.0, 3.0, 0.3, 0.001, seed=7), HostSpeedEpisodes(1.0, 3.0, 0.3, 0.001, seed=7)
    times = np.arange(0.0, 60.0, 0.0037)
    for t_s in times:
        forgetting.forget_before(t_s)
        assert forgetting.slowdown_at(t_s) == kept.slowdown_at(t_s)
        assert forgetting.slowdown_at(t_s + 0.01) == kept.slowdown_at(t_s + 0.01)  # a window planned ahead


@pytest.mark.parametrize("spec", ["1e308", "1e-9"])
def test_a_slowdown_beyond_any_host_is_refused(spec):
    """1e308 ran to exit 0 with infinite latencies and numpy overflow warnings."""
    with pytest.raises(ValueError, match=f"--host-slowdown must be a finite number from 0.001 to 1000, got {spec}"):
        parse_host_slowdown(spec)


def test_parse_host_slowdown():
    assert parse_host_slowdown("calibrated") is None
    assert parse_host_slowdown("1.5") == ConstantHostSpeed(1.5)
    episodes = parse_host_slowdown("episodes:1,2,0.5,3", seed=4)
    assert isinstance(episodes, HostSpeedEpisodes) and episodes.name == "episodes:1,2,0.5,3"


def test_the_cost_model_description_names_the_host_speed_used(tmp_path):
    """A replay at --host-slowdown 2 (or a timeline, or episodes) was described, on the CLI line and in summary.json,
    by the profile's calibrated host factor ("serving-calibrated (host x0.83, ...)"), which it did not use."""
    from sim.config import SimConfig
    from sim.cost_model import RooflineCostModel
    from sim.hardware import get_gpu
    from sim.simulator import cost_model_description

    model = ProfiledCostModel.load(PROFILE)
    base, calibration = model.name.split(", serving-calibrated (")
    assert cost_model_description(model, "calibrated") == model.name
    assert cost_model_description(model, "2") == (f"{base}, host slowdown 2 (--host-slowdown, not the "
                                                  f"serving-calibrated {calibration}")
    timeline = tmp_path / "slow.csv"
    timeline.write_text("start_s,slowdown\n0,1\n5,2\n")
    assert cost_model_description(model, str(timeline)).startswith(f"{base}, host slowdown timeline:slow.csv (")
    uncalibrated = ProfiledCostModel({**model.fit, "serving": None}, "profile:grid")
    assert cost_model_description(uncalibrated, "episodes:1,3,0.25,2") == ("profile:grid, host slowdown "
                                                                          "episodes:1,3,0.25,2 (--host-slowdown)")
    roofline = RooflineCostModel(SimConfig().model_shape, get_gpu("h200"), 1)
    assert cost_model_description(roofline, "calibrated") == "roofline-estimate"
    assert cost_model_description(roofline, "0.5") == "roofline-estimate, host slowdown 0.5 (--host-slowdown)"


def _batch_features(num_decode: int, context: int, prefill: int = 0) -> dict:
    return {"num_seqs": num_decode + (1 if prefill else 0), "num_prefill_seqs": 1 if prefill else 0,
            "num_prefill_tokens": prefill, "prefill_context_tokens": 0, "num_decode_seqs": num_decode,
            "decode_context_tokens": num_decode * context, "prefill_attention_pairs": prefill * (prefill + 1) // 2,
            "max_decode_context_tokens": context if num_decode else 0}


def test_profiled_model_scales_only_the_host_bound_parts():
    model = ProfiledCostModel.load(PROFILE)
    fit = model.fit
    serving = fit["serving"]
    assert model.host_factor == pytest.approx(serving["host_factor"])
    small_prefill = _batch_features(8, 512, prefill=64)
    host, gpu = model.eager_parts(small_prefill)
    assert host > 0 and gpu > 0
    grid, slow = model.predict(small_prefill, host_slowdown=1.0), model.predict(small_prefill, host_slowdown=2.0)
    # Only the host part follows the host's speed: twice as slow a host adds the host part once more (piecewise
    # graphs: host work plus device time) or doubles a host-bound step (eager launches: the larger of the two).
    assert slow - grid == pytest.approx(host) if model.eager_form == "sum" else slow == pytest.approx(2 * grid)
    between = model.predict(small_prefill)  # the calibrated host factor by default
    assert min(grid, slow) <= between <= max(grid, slow) or model.host_factor < 1 and between < grid
    decode = _batch_features(64, 1024)
    grid_decode = ProfiledCostModel({**fit, "serving": None}, "grid").predict(decode)
    # Calibrated by default: the decode factor, and the serving extra of the step's graph bucket (it repeats its batch)
    assert model.predict(decode) == pytest.approx(model.decode_factor * grid_decode + model._decode_extra_s[64])
    # Another host speed moves decode steps along a line of slope host_share through the calibrated point.
    assert model.predict(decode, 2.0) - model.predict(decode) == pytest.approx(
        model.host_share * (2.0 - model.host_factor) * grid_decode)


def test_one_long_context_costs_extra_only_in_large_batches():
    model = ProfiledCostModel.load(PROFILE)
    per_token = model.fit["graph_decode"]["per_excess_context_token_s"]
    assert per_token > 0
    for bs, extra in ((64, True), (8, False)):
        equal = _batch_features(bs, 1024)
        skewed = dict(equal, max_decode_context_tokens=8192)  # same KV total, one context far above the mean
        gap = model.predict(skewed) - model.predict(equal)
        assert gap == pytest.approx(model.decode_factor * per_token * (8192 - 1024)) if extra else gap == 0.0


def test_timeline_from_a_replay_reads_the_slowdown_of_its_host_bound_steps(tmp_path):
    """A fake replay whose host-bound eager steps take 1x the grid time for 4 s, then 2x (their device part at the
    profile's calibrated device factor: the timeline's slowdown scales the host part beside it)."""
    fit = json.loads(PROFILE.read_text())["fit"]
    grid = ProfiledCostModel({**fit, "serving": None}, "grid")
    device_factor = ProfiledCostModel.load(PROFILE).device_factor
    rows = []
    for i in range(40):
        f = _batch_features(8, 512, prefill=64)
        start = 0.2 * i
        slowdown = 1.0 if start < 4.0 else 2.0
        host, gpu = grid.eager_parts(f)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": i, "start_s": start,
                     "duration_s": float(grid.combine(slowdown * host, device_factor * gpu))})
    run = tmp_path / "run"
    run.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), run / "steps.parquet")
    timeline = timeline_from_run(run, PROFILE, window_s=2.0, min_steps=40)
    assert timeline.starts_s == [0.0, 2.0, 4.0, 6.0]
    assert timeline.slowdowns == pytest.approx([1.0, 1.0, 2.0, 2.0])
    with pytest.raises(ValueError, match="40 host-bound eager steps, too few"):
        timeline_from_run(run, PROFILE, window_s=2.0)  # the default asks for 100


@pytest.mark.parametrize("make", [
    lambda: ConstantHostSpeed(math.nan),
    lambda: HostSpeedTimeline([0.0, math.inf], [1.0, 1.2]),
    lambda: HostSpeedTimeline([0.0], [math.nan]),
    lambda: HostSpeedEpisodes(1.0, math.inf, 0.5, 1.0),
], ids=["constant nan", "timeline inf start", "timeline nan slowdown", "episodes inf"])
def test_every_host_speed_refuses_non_finite_values(make):
    """Whoever builds one (a CLI spec, a CSV, timeline_from_run), NaN and infinities never get in."""
    with pytest.raises(ValueError, match="finite"):
        make()


def test_a_run_whose_requests_sampled_gives_no_timeline(tmp_path, capsys):
    """Its steps took what the sampler adds, which the profile's greedy grid does not: read as a slow host."""
    from sim.host_speed import main as host_speed_main

    run = tmp_path / "run"
    run.mkdir()
    pq.write_table(pa.table({"duration_s": [0.01]}), run / "steps.parquet")
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {"temperature": 0.7,
                                                                                        "top_p": 0.9}}))
    with pytest.raises(SystemExit) as exited:
        host_speed_main([str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "t.csv")])
    assert exited.value.code == 2 and capsys.readouterr().err == (
        f"error: run folder {run} sampled its requests (temperature 0.7, top_p 0.9); extract a timeline from a "
        "greedy engine.replay run (no --temperature)\n")
    assert not (tmp_path / "t.csv").exists()
