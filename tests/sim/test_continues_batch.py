"""Decode steps that repeat the batch before them (ScheduledBatch.continues_batch): the engine plans those while the
step before runs, so the cost model prices the others with a planning surcharge fitted on the profile grid. The flag
is the scheduler's, recorded in the step log, rebuilt exactly for step logs recorded before it existed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.core.scheduler import ScheduledBatch
from sim.batch_features import derive_continues_batch
from sim.config import SimConfig
from sim.profiled_cost_model import ProfiledCostModel, find_profile, fit_profile
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT
from traces.schema import load_trace

PROFILE = find_profile("qwen3-0.6b", "h200")


@pytest.mark.parametrize("case", [
    {},
    {"num_gpu_blocks": 60, "block_size": 16, "max_num_seqs": 32},  # preemptions
    {"num_gpu_blocks": 40, "block_size": 16, "policy": "nano", "num_replicas": 2, "router": "prefix"},
])
def test_the_flag_rebuilt_from_a_step_log_equals_the_recorded_one(case):
    result = simulate(load_trace(SHAREGPT).head(400).with_qps(20.0), SimConfig(**case))
    steps = result.steps_table().sort_by([("replica", "ascending"), ("step", "ascending")])
    column = {c: steps.column(c).to_numpy() for c in steps.column_names}
    derived = derive_continues_batch(column["replica"], column["num_seqs"], column["num_prefill_seqs"],
                                     column["num_preempted"], column["num_finished"])
    assert np.array_equal(derived, column["continues_batch"])
    decode_only = column["num_prefill_seqs"] == 0
    # Both kinds of decode steps occur (after a prefill or a finish, and in steady runs, many fast-forwarded).
    assert 0 < column["continues_batch"][decode_only].sum() < decode_only.sum()
    assert not column["continues_batch"][~decode_only].any()
    if "max_num_seqs" in case:
        assert column["num_preempted"].sum() > 0


def _decode_batch(bs: int, context: int, continues: int) -> ScheduledBatch:
    return ScheduledBatch(num_decode_seqs=bs, decode_context_tokens=bs * context, max_decode_context_tokens=context,
                          continues_batch=continues)


def test_a_decode_step_on_a_new_batch_pays_the_planning_surcharge():
    model = ProfiledCostModel.load(PROFILE)
    c, d = model.fit["graph_decode"]["unprepared_s"]
    assert c > 0  # the shipped profile's engine plans ahead (engine_features), and it shows on the grid
    for bs in (1, 32, 200):
        fresh, repeated = model.step_time_s(_decode_batch(bs, 900, 0)), model.step_time_s(_decode_batch(bs, 900, 1))
        # A step that repeats its batch pays the serving extra of its bucket instead (sim.calibrate.fit_decode_extras)
        extra_s = model._decode_extra_s[bs]
        assert fresh - repeated == pytest.approx(model.decode_factor * (c + d * bs) - extra_s, rel=1e-9, abs=1e-15)
        # The same through the features of a recorded step; a step log without the column prices as repeated.
        features = {"num_prefill_tokens": 0, "num_decode_seqs": bs, "decode_context_tokens": bs * 900,
                    "max_decode_context_tokens": 900, "num_seqs": bs}
        assert model.predict({**features, "continues_batch": 0}) == fresh
        assert model.predict(features) == repeated


@pytest.mark.parametrize("first", [0, 1])
def test_a_run_of_decode_steps_prices_only_its_first_step_by_the_flag(first):
    model = ProfiledCostModel.load(PROFILE)
    bs, steps = 48, 40
    batch = _decode_batch(bs, 700, first)
    batch.decode_context_tokens = np.arange(bs * 700, bs * 700 + bs * steps, bs, dtype=np.int64)
    batch.max_decode_context_tokens = np.arange(700, 700 + steps, dtype=np.int64)
    run_s = model.decode_run_s(batch)
    one_by_one = [model.step_time_s(_decode_batch(bs, 700 + k, first if k == 0 else 1)) for k in range(steps)]
    assert run_s.tolist() == one_by_one  # identical floats, as the step loop adds them
    assert batch.continues_batch == first and batch.max_decode_context_tokens[0] == 700  # the batch is given back


def test_no_surcharge_is_fitted_for_an_engine_that_plans_every_step_itself():
    profile = json.loads(PROFILE.read_text())
    assert fit_profile(profile)["graph_decode"]["unprepared_s"][0] > 0
    profile["engine_features"]["prepares_decode_ahead"] = False
    assert fit_profile(profile)["graph_decode"]["unprepared_s"] == [0.0, 0.0]
    del profile["engine_features"]  # profiles measured before the field: engines that did not plan ahead
    assert fit_profile(profile)["graph_decode"]["unprepared_s"] == [0.0, 0.0]
    profile["engine_features"] = "yes"  # hostile: not an object, refused by name (it was fitted as not planning ahead)
    with pytest.raises(ValueError, match="^field 'engine_features' is \"yes\"; expected an object"):
        fit_profile(profile)


@pytest.mark.parametrize("runs_ahead", [True, False])
def test_the_simulator_marks_the_steps_an_engine_that_runs_ahead_launches_during_the_step_before(runs_ahead, tmp_path):
    """A profile of an engine with run-ahead (engine_features.runs_decode_ahead) models one that launches every step
    repeating its batch during the step before where no request can be admitted next (as in every such step of a
    window, and of this run): the simulated step log's ran_ahead is continues_batch, stepped and fast-forwarded
    alike. A profile of an engine without it marks none."""
    profile = json.loads(PROFILE.read_text())
    assert profile["engine_features"]["runs_decode_ahead"] is True and profile["fit"]["runs_decode_ahead"] is True
    if not runs_ahead:
        profile["engine_features"]["runs_decode_ahead"] = False
        profile["fit"] = fit_profile(profile)
        assert profile["fit"]["runs_decode_ahead"] is False
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    result = simulate(load_trace(SHAREGPT).head(400).with_qps(20.0), SimConfig(cost_model=str(path)))
    steps = result.steps_table()
    continues, ran_ahead = (steps.column(c).to_numpy() for c in ("continues_batch", "ran_ahead"))
    assert continues.sum() > 100 and result.num_fast_forward_steps > 100
    assert np.array_equal(ran_ahead, continues if runs_ahead else np.zeros_like(continues))
