"""Routers that keep every replica's load and read again only the replicas the simulator says may have changed
(sim.router.LoadTracking, simulate's stale_loads): the same choices as reading every replica at every request."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

import sim.simulator as simulator
from benchmarks.sim_million import synthesize_sessions
from sim.config import SimConfig
from sim.router import LeastOutstandingRouter, make_router


def _fleet(loads: list[tuple[int, int]]) -> list[SimpleNamespace]:
    """Engines whose schedulers hold (waiting, running) requests."""
    return [SimpleNamespace(scheduler=SimpleNamespace(waiting=deque(range(waiting)), running=list(range(running)),
                                                      num_unfinished=waiting + running))
            for waiting, running in loads]


def _set(engine: SimpleNamespace, waiting: int, running: int) -> None:
    scheduler = engine.scheduler
    scheduler.waiting, scheduler.running = deque(range(waiting)), list(range(running))
    scheduler.num_unfinished = waiting + running


def test_tracked_loads_are_read_again_only_where_marked_stale():
    engines = _fleet([(0, 3), (1, 1), (0, 2), (2, 2)])
    router = LeastOutstandingRouter()
    stale = router.track_loads(engines)
    assert stale == set()
    assert router.route(None, engines) == 1  # loads 3, 2, 2, 4: the lowest index of the least loaded
    _set(engines[0], 0, 1)  # replica 0 down to 1, not marked: the router keeps its load of 3
    assert router.route(None, engines) == 1
    stale.add(0)
    assert router.route(None, engines) == 0  # read again: 1
    assert stale == set()  # taken in
    _set(engines[0], 3, 3)
    _set(engines[2], 0, 0)
    stale.update((0, 2))
    assert router.route(None, engines) == 2
    assert router._loads == [6, 2, 0, 4]


def test_untracked_router_reads_every_replica():
    engines = _fleet([(0, 3), (1, 1)])
    router = LeastOutstandingRouter()
    assert router.route(None, engines) == 1
    _set(engines[0], 0, 0)
    assert router.route(None, engines) == 0


def _untracked(name: str):
    router = make_router(name)
    router.track_loads = None  # simulate then reads every replica at every request, as before
    return router


@pytest.mark.parametrize("router", ["prefix", "lor"])
def test_simulation_with_tracked_loads_is_the_same(monkeypatch, router):
    trace = synthesize_sessions(400, 60.0, 0)  # multi-turn sessions on 8 replicas: loads that tie and differ
    config = SimConfig(num_replicas=8, router=router)
    tracked = simulator.simulate(trace, config)
    monkeypatch.setattr(simulator, "make_router", _untracked)
    untracked = simulator.simulate(trace, config)
    assert tracked.requests_table().equals(untracked.requests_table())
    assert tracked.steps_table().equals(untracked.steps_table())
    assert len(set(tracked.requests_table()["replica"].to_pylist())) > 4  # the loads did spread them
