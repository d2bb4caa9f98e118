"""Prediction bands (sim.bands, analysis.bands): deterministic for a --seed whatever the pool, ordered, what each
replay varies, and bad --bands values refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.band_stats import band_of, flat_bands, inside
from analysis.bands import run_bands
from analysis.capacity.executors import default_num_jobs
from cli.sim_replay import main as replay_main
from engine.core.scheduler import ScheduledBatch
from sim.bands import PerturbedCostModel, band_model, band_points, replay_setup
from sim.calibrate import with_sessions
from sim.config import SimConfig
from sim.host_speed import HostSpeedEpisodes, parse_host_slowdown
from sim.simulator import make_cost_model
from tests.sim.helpers import SHAREGPT, make_trace

# 40 requests at 8 req/s: long enough for slow episodes to matter, short enough for CI.
TRACE = make_trace([300 + 37 * (i % 11) for i in range(40)], [40 + 7 * (i % 5) for i in range(40)],
                   [i / 8 for i in range(40)])


def _assert_ordered(bands: dict) -> None:
    flat = flat_bands({"bands": bands})
    assert flat and "ttft_ms.p50" in flat and "output_throughput" in flat
    for key, band in flat.items():
        assert band["p5"] <= band["median"] <= band["p95"], key


def test_bands_are_deterministic_ordered_and_the_same_in_a_pool() -> None:
    config = SimConfig()
    serial = run_bands(TRACE, config, 4)
    assert serial == run_bands(TRACE, config, 4)
    assert run_bands(TRACE, config, 4, num_jobs=2) == serial  # each replay depends on --seed and its index only
    _assert_ordered(serial)
    assert serial["num_replays"] == 4 and serial["seed"] == 0
    ttft = serial["metrics"]["ttft_ms"]["p50"]
    assert ttft["p5"] < ttft["p95"]  # the replays do differ
    other = run_bands(TRACE, SimConfig(seed=1), 4)
    assert other["metrics"]["ttft_ms"] != serial["metrics"]["ttft_ms"]


def test_band_of_is_the_median_and_p5_p95_of_the_replays() -> None:
    assert band_of([4.0, 1.0, 3.0, 2.0, 5.0]) == {"median": 3.0, "p5": 1.2, "p95": 4.8}
    assert band_of([2.0, 2.0]) == {"median": 2.0, "p5": 2.0, "p95": 2.0}
    assert inside({"p5": 1.0, "p95": 2.0}, 1.0) is True and inside({"p5": 1.0, "p95": 2.0}, 2.5) is False
    assert inside({"p5": 1.0, "p95": 2.0}, None) is None


def test_each_replay_varies_the_host_and_the_step_times(tmp_path: Path) -> None:
    # The committed profile, calibrated on a second machine session 20 % slower than its own (sim.calibrate --add
    # merges sessions so): the machines' range is what the bands draw each replay's mean host speed from.
    profile = json.loads(Path("sim/profiles/h200/qwen3-0.6b.json").read_text())
    serving = profile["serving"]
    merged_keys = ("sessions", "host_factor_range", "decode_factor_range")
    first_session = {k: v for k, v in serving.items() if k not in merged_keys}
    if "sessions" not in serving:
        slower = {**first_session, "host_factor": round(1.2 * first_session["host_factor"], 4), "runs": []}
        profile["serving"] = with_sessions(serving, slower)
        profile["fit"]["serving"] = profile["serving"]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    config = SimConfig(cost_model=str(path))
    shape = config.model_shape
    bands = band_model(config, shape)
    # The calibrated host factor of the profile is the mean slowdown; residuals from every timed repeat of the points
    # the bands draw from (all but the one marked as a timing artifact).
    assert bands.host_mode == "episodes" and bands.mean_slowdown == profile["serving"]["host_factor"]
    points = band_points(profile)
    assert len(points) == len(profile["points"]) - 1
    assert len(bands.decode_residuals) + len(bands.eager_residuals) == sum(len(p["times_s"]) for p in points)
    assert len(bands.decode_offsets) + len(bands.eager_offsets) == len(points)  # the fit's error per point
    base = make_cost_model(config, shape)
    first, cost_model = replay_setup(config, base, bands, 0)
    assert isinstance(cost_model, PerturbedCostModel) and cost_model.name == base.name
    # The episodes follow the calibration's measured process (serving.host_episodes), around a mean host factor
    # one of the calibrated machine sessions' own.
    measured = profile["serving"]["host_episodes"]
    lo, hi = measured["slow_share_range"]
    slow = measured["slow_over_normal"]
    machines = tuple(s["host_factor"] for s in profile["serving"]["sessions"])
    assert len(set(machines)) > 1 and bands.machine_host_factors == machines
    spec = first.host_slowdown
    normal, slowed = (float(v) for v in spec.removeprefix("episodes:").split(",")[:2])
    assert slowed == pytest.approx(normal * slow, rel=1e-5)
    mean = normal * (1 + (lo + hi) / 2 * (slow - 1))
    assert min(abs(mean / machine - 1) for machine in machines) < 1e-5
    assert spec.endswith(f",{measured['mean_episode_s']:g},1048576")
    process = parse_host_slowdown(spec, seed=0)
    assert isinstance(process, HostSpeedEpisodes) and lo <= process.fraction <= hi
    second, _ = replay_setup(config, base, bands, 1)
    assert second.host_slowdown != spec and second.host_slowdown.endswith(",2097152")
    assert replay_setup(config, base, bands, 0)[0] == first  # a function of the seed and the index
    # A number is the mean slowdown; the user's episodes are drawn anew; a roofline run varies the host only.
    assert band_model(SimConfig(host_slowdown="2"), shape).mean_slowdown == 2.0
    user = SimConfig(host_slowdown="episodes:1,2,0.3,3,5")
    assert replay_setup(user, base, band_model(user, shape), 1)[0].host_slowdown == "episodes:1,2,0.3,3,2097157"
    roofline = SimConfig(cost_model="roofline")
    roofline_bands = band_model(roofline, shape)
    assert roofline_bands.decode_residuals is None and roofline_bands.mean_slowdown == 1.0
    assert replay_setup(roofline, base, roofline_bands, 0)[1] is base


def test_every_replay_number_and_episodes_seed_make_a_valid_host_slowdown() -> None:
    """A replay's episodes seed, (index + 1) * 2**20 (plus the user's own), passed the 2**62 --host-slowdown takes:
    analysis.capacity --bands --seed-offset 2**63-1 and sim.replay --bands --host-slowdown episodes:...,2**62-1 ended
    in a ValueError traceback. The seed is now taken modulo 2**62."""
    config = SimConfig(cost_model="roofline")
    shape = config.model_shape
    base = make_cost_model(config, shape)
    index = 2**63 - 1
    spec = replay_setup(config, base, band_model(config, shape), index)[0].host_slowdown
    assert spec.endswith(f",{2**63 * 2**20 % 2**62}") and isinstance(parse_host_slowdown(spec), HostSpeedEpisodes)
    user = SimConfig(host_slowdown=f"episodes:1,2,0.3,3,{2**62 - 1}", cost_model="roofline")
    spec = replay_setup(user, base, band_model(user, shape), 0)[0].host_slowdown
    assert spec == f"episodes:1,2,0.3,3,{2**20 - 1}" and isinstance(parse_host_slowdown(spec), HostSpeedEpisodes)


@pytest.mark.parametrize(("slowdown", "normal", "slow"), [("0.001", 0.001, None), ("1000", None, 1000.0)])
def test_bands_around_a_host_slowdown_at_the_edge_stay_within_the_host_speeds(slowdown, normal, slow) -> None:
    """--host-slowdown 0.001 or 1000 with --bands: the band replays' normal periods fell below 0.001 or their slow
    ones above 1000, and every replay failed with a ValueError traceback. They are now held within."""
    config = SimConfig(cost_model="roofline", host_slowdown=slowdown)
    shape = config.model_shape
    base, bands = make_cost_model(config, shape), band_model(config, shape)
    for index in range(20):
        spec = replay_setup(config, base, bands, index)[0].host_slowdown
        process = parse_host_slowdown(spec)
        assert isinstance(process, HostSpeedEpisodes)
        assert 0.001 <= process.normal <= process.slow <= 1000
        assert normal is None or process.normal == normal
        assert slow is None or process.slow == slow


def test_a_perturbed_step_is_the_model_times_its_replay_offset_and_a_repeat_noise() -> None:
    config = SimConfig()
    bands = band_model(config, config.model_shape)
    base = make_cost_model(config, config.model_shape)
    model = PerturbedCostModel(base, bands, np.random.default_rng(0))
    # One offset per regime for the whole replay, drawn from the fit's errors at the grid points.
    assert np.isclose(bands.decode_offsets, model.decode_scale - 1, rtol=0, atol=1e-12).any()
    assert np.isclose(bands.eager_offsets, model.eager_scale - 1, rtol=0, atol=1e-12).any()
    decode = ScheduledBatch(num_decode_seqs=8, decode_context_tokens=8 * 500, max_decode_context_tokens=500)
    prefill = ScheduledBatch(num_prefill_seqs=1, num_prefill_tokens=1000, prefill_attention_pairs=500_000)
    replica_1 = model.for_replica(1)
    for batch, pool, scale in ((decode, bands.decode_residuals, model.decode_scale),
                               (prefill, bands.eager_residuals, model.eager_scale)):
        ratios, again, other_replica = [], [], []
        for step_index in range(20):
            batch.step_index = step_index
            price = base.step_time_s(batch) * scale
            ratios.append(model.step_time_s(batch) / price - 1)
            again.append(model.step_time_s(batch) / price - 1)
            other_replica.append(replica_1.step_time_s(batch) / price - 1)
        assert all(np.isclose(pool, r, rtol=0, atol=1e-9).any() for r in ratios + other_replica)
        assert len(set(ratios)) > 1  # noise per step ...
        assert again == ratios  # ... that the same step gets whenever it is priced ...
        assert other_replica != ratios  # ... and another replica's step of the same number does not
    # The quiet-window path: the decode offset, and one repeat noise per step of a decode run, each the noise
    # step_time_s gives that step.
    decode.decode_context_tokens = 8 * 500 + 8 * np.arange(16)
    decode.max_decode_context_tokens = 500 + np.arange(16)
    decode.step_index = np.arange(4, 20)
    ratios = model.decode_run_s(decode) / (base.decode_run_s(decode) * model.decode_scale) - 1
    assert len(ratios) == 16 and all(np.isclose(bands.decode_residuals, r, rtol=0, atol=1e-9).any() for r in ratios)
    singles = []
    for k in range(16):
        step = ScheduledBatch(num_decode_seqs=8, decode_context_tokens=8 * 500 + 8 * k,
                              max_decode_context_tokens=500 + k, continues_batch=decode.continues_batch,
                              step_index=4 + k)
        singles.append(model.step_time_s(step) / (base.step_time_s(step) * model.decode_scale) - 1)
    assert np.allclose(ratios, singles, rtol=0, atol=1e-12)
    decode.step_index = 4  # a run's first step alone: the others follow it
    assert np.array_equal(model.decode_run_s(decode), model.decode_run_s(
        ScheduledBatch(num_decode_seqs=8, decode_context_tokens=decode.decode_context_tokens,
                       max_decode_context_tokens=decode.max_decode_context_tokens, step_index=np.arange(4, 20))))
    assert model.decode_run_s(prefill) is None
    for pool in (bands.decode_residuals, bands.eager_residuals, bands.decode_offsets, bands.eager_offsets):
        assert np.all(pool > -1)  # every step time stays > 0
    # Another replay of the same band draws its own offsets.
    offsets = {(PerturbedCostModel(base, bands, np.random.default_rng(i)).eager_scale) for i in range(10)}
    assert len(offsets) > 1


@pytest.mark.parametrize("value", ["1", "0", "-2", "x", "2.5", "1001", ""])
def test_bad_bands_values_exit_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as exited:
        replay_main([str(SHAREGPT), "--limit", "5", "--out", str(tmp_path / "out"), "--bands", value])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (f"error: --bands must be an integer from 2 to 1000 (the number of seeded "
                                       f"replays; a band needs at least two), got {value!r}\n")
    assert not (tmp_path / "out").exists()


def test_an_episodes_seed_must_be_a_non_negative_integer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        replay_main([str(SHAREGPT), "--limit", "5", "--out", str(tmp_path / "out"),
                     "--host-slowdown", "episodes:1,2,0.3,3,-1"])
    assert exited.value.code == 2
    assert "optionally ,SEED (an integer from 0 to 2**62 - 1)" in capsys.readouterr().err


def test_the_cli_and_the_report_show_bands_and_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert replay_main([str(SHAREGPT), "--limit", "30", "--qps", "5", "--out", str(out), "--bands", "2",
                        "--num-gpu-blocks", "1000000"]) == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary)[-2:] == ["warnings", "bands"]  # after the metrics, cost model, trace and config
    assert "prediction bands over 2 seeded replays (median [p5 - p95]):" in stdout.splitlines()
    assert [w["code"] for w in summary["warnings"]] == ["kv_blocks_beyond_memory"]
    assert f"warning [kv_blocks_beyond_memory]: {summary['warnings'][0]['message']}" in stdout.splitlines()
    page = (out / "report.html").read_text()
    assert "prediction bands over 2 seeded replays" in page and "kv_blocks_beyond_memory" in page
    assert "<td>ttft_ms.p50</td>" in page


def test_ctrl_c_during_the_band_replays_stops_them_and_writes_nothing(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import threading
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.replay", str(SHAREGPT), "--limit", "1000", "--qps", "100", "--out", str(out),
         "--no-report", "--bands", "200"],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background shell ignores SIGINT
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while b"bands:" not in b"".join(chunks):  # the band replays' progress bar: the pool is running
        assert proc.poll() is None and time.monotonic() < deadline, b"".join(chunks)[-500:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130  # 200 replays would take minutes: the pool was stopped
    reader.join(timeout=5)
    stderr = b"".join(chunks).decode()
    assert stderr.splitlines()[-1] == f"interrupted: nothing written to {out}" and "Traceback" not in stderr
    assert not out.exists()


@pytest.mark.skipif(default_num_jobs() < 2, reason="the band replays run in a pool only with two cores or more")
@pytest.mark.parametrize("delay_s", [0.0, 0.4, 0.8, 1.2])
def test_ctrl_c_to_the_process_group_while_the_pool_starts_is_one_line(tmp_path: Path, delay_s: float) -> None:
    # A terminal's Ctrl-C reaches the whole process group: a worker still importing printed a KeyboardInterrupt
    # traceback and died, and the replay then hung writing to its pipe (until killed).
    import signal
    import sys

    from tests.signals import signal_group_after

    out = tmp_path / "out"
    status, stderr, _ = signal_group_after(
        [sys.executable, "-m", "sim.replay", str(SHAREGPT), "--limit", "300", "--qps", "50", "--out", str(out),
         "--no-report", "--bands", "50"],
        b"bands:", delay_s, signal.SIGINT, Path(__file__).resolve().parents[2], start_timeout_s=120)  # pool starting
    assert status == 130
    assert stderr.splitlines()[-1] == f"interrupted: nothing written to {out}" and "Traceback" not in stderr
    assert not out.exists()


def test_a_band_replay_builds_no_step_table_and_gives_the_figures_one_would(monkeypatch):
    """The step table (a row per step) was built in every band worker though no banded figure reads it: as much
    memory per worker as the run's outputs. The figures are those of a summary given the table."""
    import polars as pl

    from analysis.bands import banded_metrics, replay_metrics
    from analysis.metrics import summarize
    from analysis.runs import with_latency_columns
    from analysis.slo import parse_slos
    from sim.bands import band_replay
    from sim.simulator import SimResult, simulate
    from traces.schema import load_trace

    trace = load_trace(SHAREGPT).head(200).with_qps(20.0)
    config, slos = SimConfig(num_gpu_blocks=200), parse_slos("ttft_p90=200ms")
    replay_config, cost_model = band_replay(config, 1)
    result = simulate(trace, replay_config, cost_model=cost_model)
    requests = with_latency_columns(pl.from_arrow(result.requests_table()))
    expected = banded_metrics(summarize(requests, pl.from_arrow(result.steps_table()), slos))

    def refused(self):
        raise AssertionError("a band replay built its step table")

    monkeypatch.setattr(SimResult, "steps_table", refused)
    assert replay_metrics(trace, config, 1, slos) == expected
