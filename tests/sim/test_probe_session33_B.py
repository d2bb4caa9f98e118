"""Session 33 (helper B), the quiet window's fast path: a host speed that changes between the last step before the
horizon and the step in progress at it is priced as the step loop prices it (the runner's array passes cut at the
horizon by one helper, quiet_segment_ends_s's and quiet_step_ends_s's alike), and the replica loop asks the planner
for a window through waiting requests only where one can form."""

from __future__ import annotations

import math

import pytest

from engine.core.quiet_window import admits_none, admits_none_from
from sim.config import SimConfig
from sim.host_speed import HostSpeedTimeline
from sim.profiled_cost_model import ProfiledCostModel, find_profile
from sim.runner import CostModelRunner
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT, FixedClock, decode_only_batch
from traces.schema import load_trace


@pytest.mark.parametrize("faster_after", [True, False])
def test_a_host_speed_change_next_to_the_horizon_is_priced_as_step_by_step(faster_after):
    """Horizons swept across the steps around a change of host speed, the change itself placed before, at and after
    the end of each of those steps: a pass priced at the old speed that the horizon cuts may hold a step that starts
    after the change (priced again at the new speed, it may end before the horizon, or later), with and without the
    step in progress at the horizon."""
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    start_s = 10.0

    slowdowns = [2.0, 0.5] if faster_after else [0.5, 2.0]

    def runner(change_s: float) -> CostModelRunner:
        host = HostSpeedTimeline([0.0], slowdowns[:1]) if change_s == math.inf else \
            HostSpeedTimeline([0.0, change_s], slowdowns)
        return CostModelRunner(model, host_speed=host, clock=FixedClock(start_s))

    # The steps' ends at the first speed throughout: the change and the horizons are placed around the 40th.
    plain = runner(math.inf)._step_ends_one_by_one(decode_only_batch(3, 3000, 1200), start_s, 80, math.inf)
    checked = 0
    for change_s in (plain[38], math.nextafter(plain[38], math.inf), (plain[38] + plain[39]) / 2, plain[39]):
        ends = runner(change_s)._step_ends_one_by_one(decode_only_batch(3, 3000, 1200), start_s, 80, math.inf)
        horizons = sorted({*ends[36:44], *((a + b) / 2 for a, b in zip(ends[36:44], ends[37:45])),
                           *(math.nextafter(e, math.inf) for e in ends[36:44])})
        for horizon_s in horizons:
            for cross_horizon in (False, True):
                for max_steps in (80, 41):
                    expected = runner(change_s)._step_ends_one_by_one(decode_only_batch(3, 3000, 1200), start_s,
                                                                      max_steps, horizon_s, cross_horizon)
                    got = runner(change_s).quiet_step_ends_s(decode_only_batch(3, 3000, 1200), start_s, max_steps,
                                                             horizon_s, cross_horizon).tolist()
                    assert got == expected, (change_s, horizon_s, cross_horizon, max_steps)
                    checked += 1
    assert checked > 200


@pytest.mark.parametrize("options", [{}, {"max_num_seqs": 24}, {"policy": "nano", "max_num_seqs": 8},
                                     {"max_num_batched_tokens": 16, "max_num_seqs": 256}])
def test_admits_none_from_is_the_count_admits_none_starts_at(options):
    """The replica loop skips the planner with requests waiting unless the batch is at least admits_none_from rows:
    that count is where admits_none (the planner's own test) starts to hold."""
    config = SimConfig(**options)
    sched_config = config.resolved_for(config.model_shape)

    class _Scheduler:
        def __init__(self, num_running: int) -> None:
            self.config = sched_config
            self.running = [None] * num_running

    fewest = admits_none_from(sched_config)
    for num_running in range(0, 300):
        assert admits_none(_Scheduler(num_running)) == (num_running >= fewest)


def test_waiting_windows_still_form_where_the_batch_can_be_full():
    """With max_num_seqs at most _MAX_QUEUED_WINDOW_SEQS, windows through waiting requests still form (a queue
    behind a full batch), and the outputs are the step loop's."""
    trace = load_trace(SHAREGPT).head(300).with_qps(40.0)
    config = SimConfig(max_num_seqs=16)
    forwarded = simulate(trace, config)
    stepped = simulate(trace, config, fast_forward=False)
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
    waiting = forwarded.steps_table().column("num_waiting").to_pylist()
    assert forwarded.num_fast_forward_steps > 0 and max(waiting) > 0
