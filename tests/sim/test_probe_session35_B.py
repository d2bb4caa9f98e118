"""Session 35 (B): an arrival advances only the lazy windows with an event before it (the windows kept in a heap by
their next event, not all replicas read at every arrival), and a simulation runs with fewer garbage collections."""

from __future__ import annotations

import gc

import pytest

from benchmarks.sim_million import synthesize_sessions
from engine.core.quiet_window import QuietRun
from sim import simulator
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import RecordingPrefixRouter


def test_the_router_reads_every_replica_as_the_step_loop_leaves_it_though_few_windows_are_advanced(monkeypatch):
    """Multi-turn sessions on 16 replicas: at every arrival each replica's queues, cached prefix and blocks in use are
    the step loop's, and the outputs are too; yet the arrivals advanced far fewer windows than 16 a request (each
    window with an event before the arrival, found in the heap), and windows were advanced mid-window."""
    trace = synthesize_sessions(1500, 160.0, 0)
    config = SimConfig(num_replicas=16, router="prefix")
    stepped_views, forwarded_views = [], []
    monkeypatch.setattr(simulator, "make_router", lambda name: RecordingPrefixRouter(stepped_views))
    stepped = simulate(trace, config, fast_forward=False)

    advanced = {"mid-window": 0, "pops": 0}
    advance, heappop = QuietRun.advance, simulator.heappop

    def advance_and_count(run, t_s):
        if t_s < run.window.end_s:
            advanced["mid-window"] += 1
        return advance(run, t_s)

    def heappop_and_count(heap):
        advanced["pops"] += 1
        return heappop(heap)

    monkeypatch.setattr(QuietRun, "advance", advance_and_count)
    monkeypatch.setattr(simulator, "heappop", heappop_and_count)
    monkeypatch.setattr(simulator, "make_router", lambda name: RecordingPrefixRouter(forwarded_views))
    forwarded = simulate(trace, config, fast_forward=True)
    assert len(forwarded_views) == len(stepped_views) == len(trace)
    assert forwarded_views == stepped_views
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
    assert forwarded.num_fast_forward_steps > 0.9 * forwarded.steps_table().num_rows
    assert advanced["mid-window"] > len(trace) // 2  # windows were read mid-way, through their events
    assert advanced["pops"] < 3 * len(trace)  # (2,736): not 16 windows read a request


@pytest.mark.parametrize("young", [700, 100_000, 0])
def test_a_simulation_collects_its_youngest_generation_less_often_and_restores_the_threshold(young, monkeypatch):
    """During simulate() the youngest generation's threshold is at least _GC_YOUNG_OBJECTS (a higher one kept, 0,
    collection off, left at 0); after it, the caller's thresholds are back, an error or not."""
    trace = synthesize_sessions(20, 20.0, 0)
    during = []
    before = gc.get_threshold()
    try:
        gc.set_threshold(young, 9, 11)
        simulate(trace, SimConfig(num_replicas=2, router="prefix"),
                 on_request_done=lambda count: during.append(gc.get_threshold()))
        assert gc.get_threshold() == (young, 9, 11)
        expected = 0 if young == 0 else max(young, simulator._GC_YOUNG_OBJECTS)
        assert during and set(during) == {(expected, 9, 11)}

        def failing(count):
            raise KeyError("stop")

        with pytest.raises(KeyError):
            simulate(trace, SimConfig(num_replicas=2, router="prefix"), on_request_done=failing)
        assert gc.get_threshold() == (young, 9, 11)
    finally:
        gc.set_threshold(*before)
