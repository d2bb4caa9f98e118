"""sim.bands' step-time pools: repeat noise centred on each point's mean, points marked as timing artifacts left out of
both pools (not out of the fit), and a band replay a function of --seed and its index."""

from __future__ import annotations

import json
import math

import numpy as np

from engine.core.scheduler import ScheduledBatch
from sim.bands import _residual_pools, band_model, band_points, grid_model, grid_offset, repeat_noise, replay_setup
from sim.config import SimConfig
from sim.profiled_cost_model import PROFILE_DIR
from sim.simulator import make_cost_model

H200 = PROFILE_DIR / "h200" / "qwen3-0.6b.json"


def _profile_with(points: list[dict]) -> dict:
    """The shipped H200 profile's fit over ``points`` (each a copy of a shipped point with the times given)."""
    profile = json.loads(H200.read_text())
    return {**profile, "points": points}


def test_a_points_repeat_noise_is_each_repeat_over_their_mean_and_averages_zero() -> None:
    # Binary-exact times: a right-skewed point (one slow repeat) is centred on its mean (1.0), not its median (0.75).
    assert repeat_noise({"times_s": [0.5, 0.75, 0.75, 2.0], "median_s": 0.75}) == [-0.5, -0.25, -0.25, 1.0]
    assert repeat_noise({"times_s": [0.125, 0.375], "median_s": 0.25}) == [-0.5, 0.5]
    assert repeat_noise({"median_s": 0.003}) == [0.0]  # no repeats kept: the point's time alone, no noise
    assert repeat_noise({"times_s": [0.0, 0.25, 0.75], "median_s": 0.25}) == [-0.5, 0.5]  # an unmeasured repeat: none


def test_every_shipped_points_noise_averages_zero_and_the_pools_are_the_points_noise() -> None:
    for path in sorted(PROFILE_DIR.glob("*/qwen3-*.json")):
        profile = json.loads(path.read_text())
        points = band_points(profile)
        for point in points:
            noise = repeat_noise(point)
            assert len(noise) == len(point["times_s"]) and abs(math.fsum(noise)) < 1e-12 * len(noise), path
        decode, eager, *_ = _residual_pools(profile)
        assert sorted([*decode, *eager]) == sorted(n for p in points for n in repeat_noise(p)), path
        assert abs(math.fsum(decode)) < 1e-10 and abs(math.fsum(eager)) < 1e-10, path


def test_the_bands_leave_out_exactly_the_points_marked_as_timing_artifacts() -> None:
    # The shipped profiles mark one point each, the 16-token prefill timed right after their largest decode point
    # (sim.profile freed that point's sequences in its timed step); the H200 qwen3-8b profile dropped it already.
    marked = {}
    for path in sorted(PROFILE_DIR.glob("*/qwen3-*.json")):
        profile = json.loads(path.read_text())
        left_out = [i for i, p in enumerate(profile["points"]) if p not in band_points(profile)]
        marked[f"{path.parent.name}/{path.stem}"] = left_out
        assert all("timing_artifact" in profile["points"][i] for i in left_out)
        assert all(profile["points"][i]["prefill"] == [[0, 16]] for i in left_out)
    assert marked == {"h100/qwen3-0.6b": [65], "h100/qwen3-8b": [57], "h200/qwen3-0.6b": [72], "h200/qwen3-8b": []}
    # Left out of both pools: its offset and its repeats, and nothing else.
    profile = json.loads(H200.read_text())
    artifact = profile["points"][72]
    unmarked = {k: v for k, v in artifact.items() if k != "timing_artifact"}
    with_it = _residual_pools(_profile_with([*band_points(profile), unmarked]))
    without = _residual_pools(profile)
    grid = grid_model(profile["fit"])
    assert with_it[3].tolist() == [*without[3].tolist(), grid_offset(grid, unmarked)]
    assert with_it[1].tolist() == [*without[1].tolist(), *repeat_noise(unmarked)]
    assert with_it[0].tolist() == without[0].tolist() and with_it[2].tolist() == without[2].tolist()


def test_the_same_seed_and_replay_give_the_same_band_replay() -> None:
    config = SimConfig(seed=7)
    shape = config.model_shape
    base, bands = make_cost_model(config, shape), band_model(config, shape)
    batch = ScheduledBatch(num_prefill_seqs=1, num_prefill_tokens=1000, prefill_attention_pairs=500_000, step_index=3)

    def replay(seed: int, index: int) -> tuple:
        replay_config, model = replay_setup(SimConfig(seed=seed), base, bands, index)
        return replay_config.host_slowdown, model.decode_scale, model.eager_scale, model.step_time_s(batch)

    assert replay(7, 2) == replay(7, 2)
    assert replay(7, 2) != replay(7, 3) and replay(7, 2) != replay(8, 2)
    assert np.isclose(bands.eager_offsets, replay(7, 2)[2] - 1, rtol=0, atol=1e-12).any()
