"""Session 37, helper D: fewer simpy events per request where the router reads the replicas (lazy quiet windows).

- A lazy window in which every running sequence finishes leaves its replica idle: its end is not queued, the replica
  waits through it and the idleness after on one event, which the next request routed there queues (at the window's
  end or cut end) or resumes from now (arriving after the window: the arrivals process resumes the replica once the
  requests of that instant are in, no event). Expected: the same tables as the step-by-step loop, and only the ends
  of windows that leave sequences running (or were cut) queued.
- A replica's step ends (token times kept as runs of them) grow with room ahead (inf), written in place; a cut's
  dropped ends become room again.
"""

from __future__ import annotations

import math
from array import array

import polars as pl

from sim import simulator
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import make_trace


def _requests(trace, config: SimConfig, fast_forward: bool = True) -> pl.DataFrame:
    return pl.from_arrow(simulate(trace, config, fast_forward=fast_forward).requests_table())


def _queued_window_ends(monkeypatch) -> list[float]:
    """The times of the lazy window ends queued in simpy from now on."""
    queued: list[float] = []
    schedule = simulator.LazyWindowEnd.schedule

    def counting(self) -> None:
        queued.append(self.at_s)
        schedule(self)

    monkeypatch.setattr(simulator.LazyWindowEnd, "schedule", counting)
    return queued


def test_a_window_in_which_every_sequence_finishes_is_not_queued(monkeypatch):
    config = SimConfig(router="prefix")  # one replica behind a router that reads it: lazy windows
    trace = make_trace([10], [400])
    stepped = _requests(trace, config, fast_forward=False)
    queued = _queued_window_ends(monkeypatch)
    result = simulate(trace, config)
    # 399 decode steps after the prefill: windows of 128 and 256 steps (the lazy plan doubles; each window that ran to
    # its cap is followed at once by the next), queued at their ends, then one of 15 steps in which the sequence
    # finishes, never queued (finished after the run, its steps counted).
    assert result.num_fast_forward_steps == 128 + 256 + 15
    assert len(queued) == 2
    assert pl.from_arrow(result.requests_table()).equals(stepped)
    assert stepped["finish_s"].to_list()[0] > queued[-1]


def test_a_request_after_the_window_resumes_its_replica_from_its_arrival(monkeypatch):
    config = SimConfig(router="prefix")
    (finish_s,) = _requests(make_trace([10], [20]), config)["finish_s"].to_list()
    trace = make_trace([10, 10], [20, 20], [0.0, finish_s + 0.01])
    stepped = _requests(trace, config, fast_forward=False)
    queued = _queued_window_ends(monkeypatch)
    requests = _requests(trace, config)
    assert requests.equals(stepped)
    (second_scheduled_s,) = requests.filter(pl.col("request_id") == "1")["first_scheduled_s"].to_list()
    assert second_scheduled_s == finish_s + 0.01  # idle: scheduled at its arrival
    assert queued == []  # both windows end with their sequence: neither queued, the second request woke it


def test_a_request_cutting_a_window_queues_its_cut_end(monkeypatch):
    config = SimConfig(router="prefix")
    (finish_s,) = _requests(make_trace([10], [200]), config)["finish_s"].to_list()
    arrival_s = finish_s / 2  # mid-window
    trace = make_trace([10, 10], [200, 20], [0.0, arrival_s])
    stepped = _requests(trace, config, fast_forward=False)
    queued = _queued_window_ends(monkeypatch)
    requests = _requests(trace, config)
    assert requests.equals(stepped)
    # The cut end first: the end of the step in progress at the arrival, the second request's first scheduling.
    (second_scheduled_s,) = requests.filter(pl.col("request_id") == "1")["first_scheduled_s"].to_list()
    assert queued[0] == second_scheduled_s > arrival_s
    assert second_scheduled_s - arrival_s < 0.1


def test_a_request_in_a_windows_last_step_queues_the_windows_own_end(monkeypatch):
    config = SimConfig(router="prefix")
    (finish_s,) = _requests(make_trace([10], [20]), config)["finish_s"].to_list()
    trace = make_trace([10, 10], [20, 20], [0.0, finish_s])  # exactly as the first finishes: in its last step
    stepped = _requests(trace, config, fast_forward=False)
    queued = _queued_window_ends(monkeypatch)
    requests = _requests(trace, config)
    assert requests.equals(stepped)
    assert queued == [finish_s]  # not cut (its last step): resumed at the window's end
    (second_scheduled_s,) = requests.filter(pl.col("request_id") == "1")["first_scheduled_s"].to_list()
    assert second_scheduled_s == finish_s


def test_step_ends_grow_with_room_ahead():
    ends_s = array("d")
    simulator._grown_step_ends(ends_s, 1)
    assert len(ends_s) == 64 and ends_s.tolist() == [math.inf] * 64  # room: later than every end
    simulator._grown_step_ends(ends_s, 65)
    assert len(ends_s) == 128  # doubled
    simulator._grown_step_ends(ends_s, 1000)
    assert len(ends_s) == 1000  # at least what is asked
    big = array("d", [0.0]) * (1 << 20)
    simulator._grown_step_ends(big, (1 << 20) + 1)
    assert len(big) == (1 << 20) + (1 << 16)  # by _STEP_ENDS_GROWTH at most


def test_fleet_rows_kept_as_step_ends_read_back_the_same():
    """Token times kept as runs of the step ends (with room ahead, cut windows' ends dropped) read back as the stepped
    run's floats, on a prefix fleet with cuts."""
    arrivals_s = [0.0, 0.05, 0.1, 0.12, 0.3, 0.31, 0.5, 0.9]
    trace = make_trace([300, 40, 300, 40, 600, 40, 300, 20], [150, 90, 40, 200, 30, 120, 60, 10], arrivals_s)
    config = SimConfig(num_replicas=2, router="prefix")
    result = simulate(trace, config)
    assert any(isinstance(row[-1], simulator.StepEnds) for row in result.request_rows)
    assert result.requests_table().equals(simulate(trace, config, fast_forward=False).requests_table())
    assert result.steps_table().equals(simulate(trace, config, fast_forward=False).steps_table())
