"""Quiet windows over large batches (engine.core.quiet_window): a sequence with no event in a window has its computed
count set up front, and only those with events are set at the window's end; a cut or a stop takes the dropped steps
back. With and without fast-forward, near capacity (~100 sequences a batch), whole, stopped mid-run and behind a
router that cuts windows, the simulator writes the same rows, and every window leaves each sequence it ran one token
ahead of its computed count."""

from __future__ import annotations

import pytest

from engine.core.quiet_window import QuietRun
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT, StopAt, assert_frames_equal, result_tables
from traces.schema import load_trace


@pytest.fixture(scope="module")
def trace():
    return load_trace(SHAREGPT).head(900)


@pytest.mark.parametrize(("config", "stop_s"), [
    ({}, None),
    ({}, 9.3),  # mid-window, in a large batch
    ({"num_replicas": 3, "router": "prefix"}, None),  # lazy windows, cut at each request routed to a replica
    ({"num_replicas": 3, "router": "prefix"}, 7.05),
])
def test_large_batch_windows_match_the_step_loop(trace, config, stop_s, monkeypatch):
    config = SimConfig(**config)
    sliced = trace.with_qps(40.0 * config.num_replicas)  # ~100 sequences a replica
    watch = None if stop_s is None else StopAt(stop_s)
    stepped = result_tables(simulate(sliced, config, fast_forward=False, watch=watch))
    finish = QuietRun.finish
    largest = [0]

    def finish_and_check(run):
        finished = finish(run)
        largest[0] = max(largest[0], len(run._running))
        for seq in run.engine.scheduler.running:  # one token sampled, not yet computed: as the step loop leaves it
            assert len(seq.token_ids) - seq.num_computed_tokens == 1
        return finished

    monkeypatch.setattr(QuietRun, "finish", finish_and_check)
    watch = None if stop_s is None else StopAt(stop_s)
    forwarded = result_tables(simulate(sliced, config, fast_forward=True, watch=watch))
    assert largest[0] >= 30  # windows over large batches did occur
    for what, left, right in zip(("requests", "steps"), stepped, forwarded, strict=True):
        assert_frames_equal(left, right, what)
