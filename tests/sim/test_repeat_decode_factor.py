"""serving.repeat_decode_factor (session 32): decode steps that repeat their batch are priced at the grid's time times
it (1 as sim.calibrate writes it where it measured the extras) plus their bucket's extra; the others at decode_factor
times the grid. Alike one step at a time, over a run of steps and under a host slowdown; a profile without the field
prices as before."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.scheduler import ScheduledBatch
from sim.calibrate import with_sessions
from sim.profiled_cost_model import ProfiledCostModel, check_fit, find_profile, fit_profile, read_profile

PROFILE = find_profile("qwen3-0.6b", "h200")


def _batch(bs: int, context: int, continues: int) -> ScheduledBatch:
    return ScheduledBatch(num_decode_seqs=bs, decode_context_tokens=bs * context, max_decode_context_tokens=context,
                          continues_batch=continues)


def _model(**serving) -> ProfiledCostModel:
    fit = fit_profile({**read_profile(PROFILE), "serving": None})
    fit["serving"] = {"host_factor": 1.3, "decode_factor": 1.1, "host_share": 0.25,
                      "decode_extra_s": {"batch_sizes": fit["graph_sizes"],
                                         "extra_s": [2e-4] * len(fit["graph_sizes"])}, **serving}
    return ProfiledCostModel(fit, "repeat")


@pytest.mark.parametrize("host_slowdown", [None, 1.3, 2.0])
def test_repeating_steps_take_their_factor_the_others_the_decode_factor(host_slowdown):
    grid = ProfiledCostModel(fit_profile({**read_profile(PROFILE), "serving": None}), "grid")
    model = _model(repeat_decode_factor=1.0)
    slowdown = 1.3 if host_slowdown is None else host_slowdown
    decode_scale = 1.1 + 0.25 * (slowdown - 1.3)
    repeat_scale = 1.0 + 0.25 / 1.1 * (slowdown - 1.3)  # the same relative slope
    for bs, context in ((1, 300), (8, 12_000), (48, 900), (200, 2_000)):
        repeated, fresh = _batch(bs, context, 1), _batch(bs, context, 0)
        assert model.step_time_s(repeated, host_slowdown) == pytest.approx(
            repeat_scale * grid.step_time_s(repeated, 1.0) + 2e-4, rel=1e-12)
        assert model.step_time_s(fresh, host_slowdown) == pytest.approx(
            decode_scale * grid.step_time_s(fresh, 1.0), rel=1e-12)


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("host_slowdown", [None, 1.6])
def test_a_run_of_steps_prices_its_first_and_later_steps_as_one_at_a_time(first, host_slowdown):
    """A quiet window's run (decode_run_s): the same floats as step by step; a first step that does not repeat its
    batch at the decode factor, the later ones at the repeating steps'."""
    model = _model(repeat_decode_factor=0.97)
    for bs in (1, 20, 48, 200):
        steps = 25
        batch = _batch(bs, 700, first)
        batch.decode_context_tokens = np.arange(bs * 700, bs * 700 + bs * steps, bs, dtype=np.int64)
        batch.max_decode_context_tokens = np.arange(700, 700 + steps, dtype=np.int64)
        run_s = model.decode_run_s(batch, host_slowdown)
        one_by_one = [model.step_time_s(_batch(bs, 700 + k, first if k == 0 else 1), host_slowdown)
                      for k in range(steps)]
        assert run_s.tolist() == one_by_one


def test_a_profile_without_the_field_prices_every_decode_step_at_its_decode_factor():
    with_field, without = _model(repeat_decode_factor=1.1), _model()
    assert without.repeat_factor == without.decode_factor == 1.1 and without.repeat_share == without.host_share
    for continues in (0, 1):
        for slowdown in (None, 0.8, 1.9):
            batch = _batch(32, 1_500, continues)
            assert with_field.step_time_s(batch, slowdown) == without.step_time_s(batch, slowdown)


def test_sessions_average_the_repeat_factor_taking_an_older_sessions_decode_factor():
    older = {"host_factor": 1.2, "decode_factor": 1.08}  # calibrated before the field: one factor on every step
    newer = {"host_factor": 1.3, "decode_factor": 1.12, "repeat_decode_factor": 1.0}
    merged = with_sessions(with_sessions(None, older), newer)
    assert merged["decode_factor"] == 1.1 and merged["repeat_decode_factor"] == 1.04
    assert "repeat_decode_factor" not in with_sessions(with_sessions(None, older), older)


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan"), "1.0"])
def test_an_unusable_repeat_factor_is_refused_naming_the_field(value):
    profile = read_profile(PROFILE)
    profile["fit"]["serving"] = {"host_factor": 1.0, "decode_factor": 1.0, "repeat_decode_factor": value}
    with pytest.raises(ValueError, match="repeat_decode_factor"):
        check_fit(profile)
