"""A capacity point's simulation stopped once an SLO is certainly missed (analysis.capacity.certain_miss): the same
verdict as the whole run, the outputs of a run it does not stop unchanged."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.capacity.certain_miss import CertainMiss, first_instant_beyond, samples_that_decide
from analysis.capacity.point import PointJob, evaluate_point
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.slo import SLO, parse_slos, percentile
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT
from traces.schema import load_trace


def test_samples_that_decide_a_percentile() -> None:
    # 10 samples: p90 interpolates between the 9th and 10th (index 8.1): two above the limit decide it, one does not.
    assert samples_that_decide(10, 90.0) == 2
    assert percentile(np.array([0.0] * 8 + [3.0, 3.0]), 90.0) > 2.0
    assert percentile(np.array([0.0] * 9 + [3.0]), 90.0) < 2.0  # one far above may or may not; not certain
    assert samples_that_decide(1, 50.0) == 1 and samples_that_decide(101, 99.0) == 2 and samples_that_decide(5, 50) == 3


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.sampled_from([50.0, 90.0, 95.0, 99.0]), st.data())
def test_that_many_samples_above_a_limit_put_the_percentile_above_it(n, q, data) -> None:
    """Whatever the other samples are (at the limit, below it, infinite), ``samples_that_decide`` samples above the
    limit put the percentile above it; one fewer may not (just above the limit, the others at 0)."""
    limit = 1.0
    needed = samples_that_decide(n, q)
    above = data.draw(st.lists(st.sampled_from([1.0 + 1e-12, 2.0, np.inf]), min_size=needed, max_size=needed))
    others = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=n - needed, max_size=n - needed))
    assert percentile(np.sort(np.array(above + others)), q) > limit
    if needed > 1:
        assert percentile(np.sort(np.array([limit + 1e-9] * (needed - 1) + [0.0] * (n - needed + 1))), q) <= limit


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e7, allow_nan=False), min_size=1, max_size=20), st.floats(1e-6, 1e4))
def test_first_instant_beyond_a_limit_is_the_least_such_float(arrivals, limit) -> None:
    a = np.array(arrivals, dtype=np.float64)
    instants = first_instant_beyond(a.copy(), limit)
    assert np.all(instants - a > limit)
    assert np.all(np.nextafter(instants, -np.inf) - a <= limit)


def _library() -> SessionLibrary:
    return SessionLibrary.from_trace(load_trace(SHAREGPT))


@pytest.mark.parametrize("qps", [60.0, 46.0])
def test_an_overloaded_point_stops_with_the_verdict_of_the_whole_run(qps) -> None:
    library = _library()
    slos = parse_slos("ttft_p90=2s,tpot_p90=100ms")
    job = PointJob(SimConfig(), qps, 0, probe=False, certain_miss=True)
    short = dict(min_duration_s=80.0, min_requests=0)
    stopped = evaluate_point(library, WorkloadParams(**short), slos, job)
    whole = evaluate_point(library, WorkloadParams(**short, early_stop=False), slos, job)
    assert (whole.feasible, whole.meets_slos, whole.stopped_early) == (False, False, False)
    assert (stopped.feasible, stopped.meets_slos, stopped.stopped_early) == (False, False, True)
    assert stopped.stream_requests < whole.stream_requests and stopped.stream_duration_s < whole.stream_duration_s
    assert whole.slo_values_ms["ttft_p90"] > 2000.0
    # The part simulated is not the load's goodput (the report drew it beside the whole runs' as if it were)
    assert stopped.goodput_rps is None and whole.goodput_rps is not None


def test_a_point_that_meets_its_slos_runs_whole_and_unchanged() -> None:
    library = _library()
    slos = parse_slos("ttft_p90=2s,tpot_p90=100ms")
    job = PointJob(SimConfig(), 20.0, 0, probe=False, certain_miss=True)
    short = dict(min_duration_s=60.0, min_requests=0)
    assert (evaluate_point(library, WorkloadParams(**short), slos, job)
            == evaluate_point(library, WorkloadParams(**short, early_stop=False), slos, job))


def _tables(result) -> tuple[pa.Table, pa.Table]:
    return result.requests_table(), result.steps_table()


@pytest.mark.parametrize("num_replicas, router", [(1, None), (2, "lor"), (2, "rr"), (3, "prefix")])
def test_a_watch_that_never_stops_the_run_changes_none_of_its_outputs(num_replicas, router) -> None:
    """Its looks come during the run (a limit of 0.5 s at a light load), so its events mix with the replicas'."""
    trace = load_trace(SHAREGPT).head(300).with_qps(8.0)
    config = SimConfig(num_replicas=num_replicas, **({"router": router} if router else {}))
    plain = simulate(trace, config)
    watch = CertainMiss(trace.requests["arrival_s"].to_numpy(), 0.0, 1e9, [SLO("ttft", "p90", 0.5)])
    watched = simulate(trace, config, watch=watch)
    assert watched.stopped_s is None and watch.missed is None and watch.next_check_s() == np.inf
    assert watch._beyond[0] < watch._needed[0]  # it looked at every request and found too few beyond the limit
    for a, b in zip(_tables(plain), _tables(watched)):
        assert a.equals(b)
