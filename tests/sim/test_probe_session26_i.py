"""Session 26, probe I: silent wrong results in the simulator's outputs, found by replaying small hand-made traces
and checking their tables against first principles and fast-forward against the step-by-step loop.

- A request reaching an idle replica was scheduled at ``previous arrival + (arrival - previous arrival)``, a float
  that may differ from its arrival by an ulp: arrivals 0.2 s and 0.9 s scheduled the second at 0.8999999999999999 s,
  before it arrived (``queue_s`` -1.1e-16 s), and arrivals 0.3 s and 0.9 s at 0.9000000000000001 s (a queue time
  where the replica was idle). ``sim.replay TRACE --qps 10 --limit 20`` on a multi-turn synthetic trace showed it.
  Expected: every request's ``first_scheduled_s`` is exactly its ``arrival_s`` when its replica is idle.
- A request turned away (its prompt longer than max_model_len) at the very instant a step ended in which another
  request finished: the two rows of requests.parquet came in one order step by step and in the other
  fast-forwarded (both have the same ``finish_s``). Expected: identical tables either way, the served row first.
- A request arriving exactly as a step of its replica ended, itself scheduled by the arrival of a request routed to
  another replica at exactly the end of the step before: the step loop took it in the next step, the fast-forwarded
  run one step later (simpy ordered same-instant events by when they were scheduled, which a quiet window changes).
  Expected: identical tables either way; an arrival comes before a step that ends at the same instant.
"""

from __future__ import annotations

import polars as pl

from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import make_trace


def _requests(trace, config: SimConfig, fast_forward: bool = True) -> pl.DataFrame:
    return pl.from_arrow(simulate(trace, config, fast_forward=fast_forward).requests_table())


def _step_ends_s(trace, config: SimConfig) -> list[float]:
    steps = simulate(trace, config, fast_forward=False).steps_table()
    return [start + duration for start, duration in zip(steps.column("start_s").to_pylist(),
                                                         steps.column("duration_s").to_pylist())]


def test_a_request_reaching_an_idle_replica_is_scheduled_exactly_at_its_arrival():
    for arrivals_s in ([0.2, 0.9], [0.3, 0.9], [0.02838463086281924, 0.204]):
        assert arrivals_s[0] + (arrivals_s[1] - arrivals_s[0]) != arrivals_s[1]  # the sum misses it
        requests = _requests(make_trace([10, 10], [2, 2], arrivals_s), SimConfig())
        assert requests["first_scheduled_s"].to_list() == arrivals_s
        queue_s = requests["first_scheduled_s"] - requests["arrival_s"]
        assert queue_s.to_list() == [0.0, 0.0]


def test_a_rejection_as_a_request_finishes_gives_the_same_rows_fast_forwarded():
    config = SimConfig(max_model_len=1024)
    (finish_s,) = _requests(make_trace([10], [200]), config)["finish_s"].to_list()
    trace = make_trace([10, 2000], [200, 5], [0.0, finish_s])  # the second is turned away as the first finishes
    stepped = _requests(trace, config, fast_forward=False)
    assert stepped["finish_s"].to_list() == [finish_s, finish_s]
    assert stepped["finish_reason"].to_list() == ["length", "rejected"]
    assert _requests(trace, config).equals(stepped)


def test_an_arrival_as_a_step_ends_is_taken_by_the_next_step_fast_forwarded_too():
    config = SimConfig(num_replicas=3, router="rr")  # rows 0 and 3 on replica 0, 1 on replica 1, 2 on replica 2
    ends_s = _step_ends_s(make_trace([10], [400]), config)
    step = 60  # well after row 1 arrives (0.05 s): replica 0 is in a quiet window by then
    assert ends_s[step] > 0.06
    # Row 2 arrives as replica 0's step ends, row 3 (replica 0's) as its next one ends.
    trace = make_trace([10, 10, 10, 10], [400, 2, 2, 2], [0.0, 0.05, ends_s[step], ends_s[step + 1]])
    stepped = _requests(trace, config, fast_forward=False)
    assert stepped.filter(pl.col("request_id") == "3")["first_scheduled_s"].to_list() == [ends_s[step + 1]]
    assert _requests(trace, config).equals(stepped)
