"""Probe session 27 (S): simulator outputs that differed with fast-forward on and off, checked against figures worked
out by hand on a cost model of a quarter second a step (binary-exact sums)."""

from __future__ import annotations

import pytest

from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import QUARTER_STEP_S as STEP_S
from tests.sim.helpers import QuarterSecondSteps, StopAt, make_trace, result_tables

# One replica behind round robin: windows planned to the next arrival, applied at once. Two behind least-outstanding
# (a router that reads the replicas): windows applied lazily, as the clock reaches them.
DEPLOYMENTS = {"one replica": {}, "two replicas, lor": {"num_replicas": 2, "router": "lor"}}


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_a_run_stopped_mid_window_holds_only_the_steps_before_the_stop(deployment, fast_forward):
    """Two requests at t=0 (16-token prompts, 40 and 6 output tokens): step 0 prefills both (first tokens at 0.25 s),
    every later step decodes; the short one gets its 6th token in step 5, ending at 1.5 s. Stopped at 2.6 s, the step
    loop has run the ten steps ending at 0.25 .. 2.5 s (the one ending at 2.75 s is in progress): the long request is
    in flight with 10 tokens, the short one finished at 1.5 s. A quiet window spans the stop with fast-forward: it
    finished every request at its planned end (40 tokens at 10 s) or, applied lazily, gave the in-flight request
    the tokens of steps after the stop and wrote none of its steps to the step log."""
    config = SimConfig(block_size=16, host_slowdown="1", **DEPLOYMENTS[deployment])
    trace = make_trace([16, 16], [40, 6])
    result = simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=fast_forward, watch=StopAt(2.6))
    assert result.stopped_s == 2.6
    requests, steps = result_tables(result)
    long, short = requests.sort("request_id").iter_rows(named=True)
    assert (long["output_tokens"], long["finish_s"], long["finish_reason"]) == (10, None, None)
    assert long["token_times_s"] == [STEP_S * k for k in range(1, 11)]
    assert (short["output_tokens"], short["finish_s"], short["finish_reason"]) == (6, 1.5, "length")
    assert short["token_times_s"] == [STEP_S * k for k in range(1, 7)]
    # One replica: both requests in each of its ten steps; two: the long one's ten, the short one's six on the other.
    assert steps.height == {1: 10, 2: 10 + 6}[config.num_replicas]
    assert steps["num_finished"].sum() == 1
    assert (steps["start_s"] + steps["duration_s"]).max() == 2.5


@pytest.mark.parametrize("deployment", sorted(DEPLOYMENTS))
def test_a_stop_in_a_windows_first_step_leaves_no_first_token(deployment):
    """A 17-token prompt under a 16-token budget: step 0 computes 16 of its tokens, step 1 (0.25-0.5 s) its last one
    alone, a decode-shaped row that samples the first token, and a window starts there. Stopped at 0.4 s, that step
    is in progress: no token yet, no first-token time, one step logged (the window's first step had set the
    first-token time at its planning and kept it)."""
    config = SimConfig(block_size=16, max_num_batched_tokens=16, host_slowdown="1", **DEPLOYMENTS[deployment])
    trace = make_trace([17], [30])
    outputs = []
    for fast_forward in (False, True):
        result = simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=fast_forward,
                          watch=StopAt(0.4))
        requests, steps = result_tables(result)
        row = requests.row(0, named=True)
        assert (row["output_tokens"], row["first_token_s"], row["token_times_s"]) == (0, None, [])
        assert row["first_scheduled_s"] == 0.0
        assert steps.height == 1 and steps["num_prefill_tokens"].to_list() == [16]
        outputs.append((result.requests_table(), result.steps_table()))
    assert outputs[0][0].equals(outputs[1][0]) and outputs[0][1].equals(outputs[1][1])
