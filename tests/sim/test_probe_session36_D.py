"""Session 36 (helper D): a quiet segment of a few steps summed one step at a time by the cost model's decode_step_s
(the function the step loop prices a decode step with), not by an array pass; a quiet run's step-log entry packed
as bytes. The same floats and the same rows as before."""

from __future__ import annotations

import math
from array import array

import pytest

from engine.core.records import _RUN_FIELDS, StepLog
from sim import runner as runner_module
from sim.profiled_cost_model import ProfiledCostModel, find_profile
from sim.runner import CostModelRunner
from tests.sim.helpers import FixedClock, decode_only_batch


@pytest.mark.parametrize("sampling", ["greedy", "temperature"])
@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_decode_step_s_is_step_time_s_and_each_entry_of_decode_steps_s(model_name, sampling):
    """decode_step_s is step_time_s's price of a decode-only graph batch given by its numbers, and the very float of
    each entry of decode_steps_s's array (skewed batches from 32 rows, a first step that does not continue)."""
    model = ProfiledCostModel.load(find_profile(model_name, "h200"), sampling=sampling)
    for bs in (1, 7, 31, 32, 33, 100, 256):
        for context, longest in ((900 * bs, 950), (3_000 * bs, 12_000), (5 * bs, 3)):
            for continues in (0, 1):
                run = model.decode_steps_s(bs, context, longest, continues, 20).tolist()
                for k in range(20):
                    step_continues = continues if k == 0 else 1
                    batch = decode_only_batch(bs, context + bs * k, longest + k)
                    batch.continues_batch = step_continues
                    price = model.decode_step_s(bs, context + bs * k, longest + k, step_continues)
                    assert price == model.step_time_s(batch) == run[k], (bs, context, longest, continues, k)


def _runner(model, scalar: bool) -> CostModelRunner:
    runner = CostModelRunner(model, clock=FixedClock(0.0))
    if not scalar:
        runner._segment_step_s = None  # array passes only, as before
    return runner


@pytest.mark.parametrize("num_seqs, context, longest", [(1, 900, 900), (37, 20_000, 3_000), (150, 300_000, 9_000)])
def test_short_segments_summed_step_by_step_give_the_array_passes_floats(num_seqs, context, longest):
    """Whatever the horizon, the step cap, the guess at a step's length and crossing the horizon or not: the
    segment's ends are the array passes' floats; short ones come as an array('d') (no numpy call), and a guess too
    short goes on in array passes after _MAX_SCALAR_STEPS steps summed one by one."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    step_s = model.decode_step_s(num_seqs, context, longest, 1)
    start_s = 12.345678
    kinds = set()
    for guess_s in (None, step_s, 1.0):
        for continues in (0, 1):
            for max_steps, horizon_s in ((1, math.inf), (3, math.inf), (12, math.inf), (30, math.inf),
                                         (5000, start_s + 0.5 * step_s), (5000, start_s + 4.5 * step_s),
                                         (5000, start_s + 11 * step_s), (5000, start_s + 60 * step_s), (7, 13.0)):
                for cross_horizon in (False, True):
                    scalar, arrays = _runner(model, True), _runner(model, False)
                    if guess_s is not None:
                        scalar._guess_s = arrays._guess_s = guess_s
                    guess_before_s = scalar._guess_s  # (inf before any: a finite horizon is taken step by step)
                    args = (num_seqs, context, longest, continues, start_s, max_steps, horizon_s, cross_horizon)
                    got = scalar.quiet_segment_ends_s(*args)
                    expected = arrays.quiet_segment_ends_s(*args)
                    assert list(got) == expected.tolist(), (guess_s, continues, max_steps, horizon_s, cross_horizon)
                    kinds.add(type(got))
                    if max_steps <= runner_module._SCALAR_STEPS or (
                            horizon_s - start_s < runner_module._SCALAR_STEPS * guess_before_s):
                        # Summed one by one: within _MAX_SCALAR_STEPS, an array('d'); a longer one went on in
                        # array passes.
                        assert isinstance(got, array) == (len(got) <= runner_module._MAX_SCALAR_STEPS)
                    else:
                        assert not isinstance(got, array)
    assert kinds == {array, type(expected)}  # both paths were taken


def test_the_guess_a_scalar_segment_leaves_is_its_last_step():
    """A segment summed one by one leaves its last step's price as the next segment's guess (as an array pass
    leaves its last entry's), so that the planner's next segment sizes its pass by it."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    runner = _runner(model, True)
    ends = runner.quiet_segment_ends_s(40, 40_000, 2_000, 0, 1.0, 5, math.inf)
    assert isinstance(ends, array) and len(ends) == 5
    assert runner._guess_s == model.decode_step_s(40, 40_000 + 4 * 40, 2_004, 1)
    assert ends[0] == 1.0 + model.decode_step_s(40, 40_000, 2_000, 0)


def test_a_quiet_runs_entry_is_packed_as_its_numbers():
    """extend_quiet writes a run's ten numbers as array('q') holds them (packed bytes, not a tuple's items)."""
    log = StepLog()
    ends = array("d", [1.5, 2.5, 3.5])
    log.extend_quiet(7, 700, 120, [(0, 11), (2, 12)], 1.0, ends, num_finished_last=2, num_waiting_last=3,
                     continues_first=1, ran_ahead=1, num_waiting=4)
    log.extend_quiet(5, 520, 123, None, 3.5, array("d", [4.5]), continues_first=0)
    assert len(_RUN_FIELDS) == 10
    assert list(log._runs) == [0, 3, 7, 700, 120, 2, 3, 1, 1, 4, 3, 1, 5, 520, 123, 0, 0, 0, 0, 0]
    assert log.num_rows == 4
    table = log.to_arrow()
    assert table.column("num_seqs").to_pylist() == [7, 7, 7, 5]
    assert table.column("decode_context_tokens").to_pylist() == [700, 707, 714, 520]
    assert table.column("num_kv_blocks_used").to_pylist() == [11, 11, 12, 12]
