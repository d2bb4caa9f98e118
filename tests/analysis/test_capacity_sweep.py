"""Sweeps (analysis.capacity.sweep): the cross product, labels, and results that do not depend on parallelism."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from analysis.capacity.bisection import SearchParams
from analysis.capacity.executors import LocalExecutor, SerialExecutor, make_executor
from analysis.capacity.sweep import (
    ANSWER_KINDS,
    MAX_DURATION_CHECKS,
    ConfigResult,
    SeedSearch,
    SweepError,
    answer_text,
    config_label,
    expand_configs,
    family_label,
    run_sweep,
    superlinear_notes,
    varying_axes,
)
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.slo import parse_slos
from sim.config import SimConfig
from tests.analysis.capacity_results import point_result
from traces.schema import load_trace

TRACE_PATH = Path(__file__).resolve().parents[2] / "traces" / "sharegpt.parquet"
# An 8B model on an L40S saturates within 120 requests, so the searches bisect rather than run away.
# The roofline cost model is pinned so a measured profile added later cannot change what is tested.
BASE = SimConfig(model="qwen3-8b", gpu="l40s", cost_model="roofline")
SLOS = parse_slos("ttft_p90=500ms,tpot_p90=50ms")
PARAMS = SearchParams(start_qps=6.0, tolerance=0.1, max_iterations=8)
# Streams of 20 s or 150 requests: far too short for a real answer, long enough to test the machinery.
WORKLOAD = WorkloadParams(min_duration_s=20.0, min_requests=150)
# The probe's measured window (the stream's first third after its warm-up) must hold PROBE_MIN_REQUESTS arrivals.
PROBE_WORKLOAD = WorkloadParams(min_duration_s=20.0, min_requests=600)


@pytest.fixture(scope="module")
def small_trace():
    return SessionLibrary.from_trace(load_trace(TRACE_PATH).head(120))


def test_cross_product_order_and_untouched_fields() -> None:
    base = SimConfig(block_size=128)
    configs = expand_configs(base, {"policy": ["mixed", "nano"], "num_replicas": [1, 2], "model": ["qwen3-0.6b"]})
    assert [(c.num_replicas, c.policy) for c in configs] == [(1, "mixed"), (1, "nano"), (2, "mixed"), (2, "nano")]
    assert {c.block_size for c in configs} == {128}
    assert len(expand_configs(base, {"gpu": ["h200", "h100"], "router": ["rr", "lor", "prefix"],
                                     "max_num_seqs": [8, 64], "tensor_parallel_size": [1, 2]})) == 24


def test_cross_product_errors_name_the_option() -> None:
    with pytest.raises(SweepError, match="--replicas: empty list"):
        expand_configs(SimConfig(), {"num_replicas": []})
    with pytest.raises(SweepError, match="cannot sweep block_size"):
        expand_configs(SimConfig(), {"block_size": [16]})


def test_a_cross_product_beyond_a_thousand_configurations_is_refused_before_building_them() -> None:
    """--replicas 1,...,300 --max-num-seqs 1,...,300: 90,000 configurations spent minutes planning, then swept for
    weeks."""
    axes = {"num_replicas": list(range(1, 301)), "max_num_seqs": list(range(1, 301)), "policy": ["mixed"]}
    with pytest.raises(SweepError, match=r"^--replicas \(300\) x --max-num-seqs \(300\) make 90,000 configurations; "
                                         r"expected at most 1,000 in one sweep"):
        expand_configs(SimConfig(), axes)
    at_limit = {"num_replicas": list(range(1, 11)), "max_num_seqs": list(range(1, 101))}
    assert len(expand_configs(SimConfig(), at_limit)) == 1000


def test_labels_name_what_varies() -> None:
    configs = expand_configs(SimConfig(), {"num_replicas": [1, 2], "router": ["rr", "prefix"]})
    varying = varying_axes(configs)
    assert varying == ["num_replicas", "router"]
    assert [config_label(c, varying) for c in configs] == ["x1 router rr", "x1 router prefix", "x2 router rr",
                                                           "x2 router prefix"]
    assert family_label(configs[3], varying) == "router prefix"
    assert config_label(SimConfig(), []) == "qwen3-0.6b h200 x1"
    assert family_label(SimConfig(), ["num_replicas"]) == "qwen3-0.6b h200"


class _Bar:
    """Records what run_sweep tells a progress bar."""

    def __init__(self) -> None:
        self.total = None
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n

    def refresh(self) -> None:
        pass


def test_serial_and_parallel_sweeps_give_identical_results(small_trace) -> None:
    configs = expand_configs(BASE, {"num_replicas": [1, 2]})
    bar = _Bar()
    serial = run_sweep(configs, PARAMS, SerialExecutor(small_trace, WORKLOAD, SLOS), progress_bar=bar, seeds=(0, 1))
    parallel = run_sweep(configs, PARAMS, LocalExecutor(small_trace, WORKLOAD, SLOS, num_jobs=2), seeds=(0, 1))
    assert [r.searches for r in serial] == [r.searches for r in parallel]
    assert all(s.outcome.monotone for r in serial for s in r.searches)
    assert serial[1].max_qps >= serial[0].max_qps  # two replicas serve no less (streams this short are noisy)
    revised = 0
    for search in (s for r in serial for s in r.searches):
        assert 1 <= len(search.checks) <= MAX_DURATION_CHECKS
        assert all(c.duration_scale == 2.0 for c in search.checks)
        verdicts = dict(search.outcome.points)
        for check in search.checks[:-1]:  # failed twice as long: counted as failed, the search went on below
            assert not check.feasible and verdicts[check.qps] is False and check.qps > search.max_qps
            assert next(p for p in search.points if p.qps == check.qps).feasible  # it had passed at T
            revised += 1
        last = search.checks[-1]
        assert last.qps == search.max_qps
        assert search.kind == ("converged" if last.feasible and search.outcome.converged else
                               "not_confirmed" if not last.feasible else "bracket")
    assert revised > 0  # streams this short disagree with twice their length: the revision path is exercised
    num_simulations = sum(r.num_simulations for r in serial)
    assert num_simulations == sum(len(s.points) + len(s.checks) for r in serial for s in r.searches)
    assert bar.n == num_simulations and bar.total == num_simulations  # the bar's total shrank to the truth


def test_k_section_runs_the_same_in_parallel(small_trace) -> None:
    configs = expand_configs(BASE, {"num_replicas": [2]})
    params = SearchParams(start_qps=6.0, tolerance=0.1, max_iterations=7, candidates_per_round=2)
    serial = run_sweep(configs, params, make_executor(small_trace, WORKLOAD, SLOS, 1), check_duration=False)
    parallel = run_sweep(configs, params, make_executor(small_trace, WORKLOAD, SLOS, 2), check_duration=False)
    assert serial[0].searches == parallel[0].searches and serial[0].searches[0].check is None
    assert len(serial[0].points) >= 5


def test_points_record_the_slo_values_and_goodput(small_trace) -> None:
    workload = WorkloadParams(min_duration_s=20.0, min_requests=150, early_stop=False)
    (result,) = run_sweep(expand_configs(BASE, {}), SearchParams(qps_min=3.0, qps_max=6.0, max_iterations=2),
                          SerialExecutor(small_trace, workload, SLOS), check_duration=False)
    assert [p.qps for p in result.points] == [3.0, 6.0]
    limits_ms = {slo.key: slo.limit_ms for slo in SLOS}
    for point in result.points:
        assert set(point.slo_values_ms) == set(limits_ms)
        within = all(v is not None and v <= limits_ms[key] for key, v in point.slo_values_ms.items())
        assert point.meets_slos == within
        assert point.feasible == (within and point.stable) and point.stable == point.stability["stable"]
        assert point.stream_duration_s == pytest.approx(150 / point.qps, rel=1e-5)  # min_requests / qps > 20 s
        assert point.warmup_s == pytest.approx(0.25 * point.stream_duration_s, rel=1e-5)
        window = point.stability
        assert (window["window_start_s"], window["window_end_s"]) == (point.warmup_s, point.stream_duration_s)
        assert point.num_requests == window["num_arrived"] < point.stream_requests
        assert 0 <= point.goodput_rps <= point.num_finished / (point.stream_duration_s - point.warmup_s) + 1e-9
        assert set(point.latency_ms) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}
        assert not point.stopped_early
    passing = [p for p in result.points if p.feasible]
    assert result.point_at_max is (passing[-1] if passing else None)


def _search(seed: int, points: tuple, max_qps, converged: bool = True, check=None) -> SeedSearch:
    from analysis.capacity.bisection import SearchOutcome

    return SeedSearch(seed, SearchOutcome(max_qps, points, converged, True), (), (check,) if check else ())


def test_answer_kinds_and_the_median_over_seeds() -> None:
    lower = _search(0, ((10.0, True), (20.0, True)), 20.0)
    bracket = _search(1, ((10.0, True), (20.0, False)), 10.0, converged=False)
    check = point_result(10.0, 100.0)
    closed = _search(2, ((10.0, True), (10.5, False)), 10.0, check=check)  # held at 2T
    nothing = _search(3, ((10.0, False),), None, converged=False)
    assert [s.kind for s in (lower, bracket, closed, nothing)] == ["lower_bound", "bracket", "converged", "none"]
    assert [answer_text(s.max_qps, s.kind) for s in (lower, bracket, closed, nothing)] == [">=20", "~10", "10",
                                                                                          "none"]
    # --no-duration-check: the bracket closed, nothing checked at 2T. Still an answer, but not called confirmed.
    unchecked = _search(5, closed.outcome.points, 10.0)
    assert unchecked.kind == "unchecked" and answer_text(10.0, "unchecked") == "10"
    assert ConfigResult(0, BASE, "x1", (unchecked,)).is_answer
    assert "twice as long (--no-duration-check)" in ANSWER_KINDS["unchecked"]
    failed_check = _search(6, closed.outcome.points, 10.0, check=dataclasses.replace(check, feasible=False))
    assert failed_check.kind == "not_confirmed" and not ConfigResult(0, BASE, "x1", (failed_check,)).is_answer
    twelve = _search(4, closed.outcome.points, 12.0, check=point_result(12.0, 100.0))
    result = ConfigResult(0, BASE, "x1", (lower, closed, twelve))
    assert result.max_qps == 12.0 and result.spread == (10.0, 20.0)  # the median of 10, 12, 20
    assert result.kind == "lower_bound"  # the least certain seed's kind
    even = ConfigResult(0, BASE, "x1", (closed, twelve))
    assert even.max_qps == 10.0 and even.kind == "converged"  # the lower middle value: one that was simulated


def test_super_linear_scaling_is_flagged() -> None:
    import dataclasses

    def result(index: int, replicas: int, max_qps: float) -> ConfigResult:
        config = dataclasses.replace(BASE, num_replicas=replicas)
        return ConfigResult(index, config, f"x{replicas}", (_search(0, ((max_qps, True),), max_qps),))

    notes = superlinear_notes([result(0, 1, 40.0), result(1, 2, 92.0), result(2, 4, 170.0)], tolerance=0.05)
    assert list(notes) == [1] and notes[1].startswith("super-linear scaling: 2 replicas serve 2.30x")
    assert superlinear_notes([result(0, 1, 40.0), result(1, 2, 83.0)], tolerance=0.05) == {}


class _RecordingExecutor(SerialExecutor):
    """A serial executor that keeps every job it was given, in order."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job)
        return super().submit(job)


def test_the_early_stop_probe_runs_only_while_no_load_has_passed(small_trace) -> None:
    """A probe that does not stop is simulated again as the stream's first third: it pays only above capacity by a
    margin, which a QPS cannot be once a load at least half of it has passed."""
    executor = _RecordingExecutor(small_trace, PROBE_WORKLOAD, SLOS)
    (result,) = run_sweep(expand_configs(BASE, {}), SearchParams(start_qps=200.0, tolerance=0.1, max_iterations=8),
                          executor)
    (search,) = result.searches
    verdicts = dict(search.outcome.points)
    points = [job for job in executor.jobs if job.duration_scale == 1.0]
    assert [job.qps for job in points] == [qps for qps, _ in search.outcome.points]
    first_pass = next(i for i, job in enumerate(points) if verdicts[job.qps])
    assert first_pass >= 2  # 200 req/s and half of it fail on an 8B model on an L40S: halved down first
    assert [job.probe for job in points] == [True] * (first_pass + 1) + [False] * (len(points) - first_pass - 1)
    assert any(p.stopped_early for p in search.points[:first_pass])  # the probe still stops far overloads
    # After it no probe runs; a later point may still stop once it has certainly missed an SLO (certain_miss, asked
    # for once a load passed), never on a probe's verdict
    later = list(zip(points[first_pass + 1:], search.points[first_pass + 1:], strict=True))
    assert all(job.certain_miss and not job.probe and not p.meets_slos for job, p in later if p.stopped_early)
    (check,) = [job for job in executor.jobs if job.duration_scale != 1.0][:1]
    assert check.probe is False and check.qps == search.outcome.max_qps  # the 2T check re-runs a passing QPS


def test_a_job_without_the_probe_simulates_an_overloaded_stream_whole(small_trace) -> None:
    from analysis.capacity.point import PointJob, evaluate_point

    probed = evaluate_point(small_trace, PROBE_WORKLOAD, SLOS, PointJob(BASE, 200.0, 0))
    whole = evaluate_point(small_trace, PROBE_WORKLOAD, SLOS, PointJob(BASE, 200.0, 0, probe=False))
    assert probed.stopped_early and not whole.stopped_early
    assert not probed.feasible and not whole.feasible
    assert probed.stream_requests < whole.stream_requests and whole.stream_duration_s > probed.stream_duration_s


def test_no_probe_judges_a_window_of_a_few_dozen_requests(small_trace, monkeypatch) -> None:
    """A probe over fewer than PROBE_MIN_REQUESTS measured arrivals is not run: the same overloaded job on a
    150-request stream (a probe window of ~37) is simulated whole, as if it had asked for no probe."""
    from analysis.capacity.point import PROBE_MIN_REQUESTS, PointJob, evaluate_point

    short = WorkloadParams(min_duration_s=0.0, min_requests=150)
    assert short.min_requests * (1 - short.warmup_fraction) / 3 < PROBE_MIN_REQUESTS
    probed = evaluate_point(small_trace, short, SLOS, PointJob(BASE, 200.0, 0))
    whole = evaluate_point(small_trace, short, SLOS, PointJob(BASE, 200.0, 0, probe=False))
    assert not probed.feasible and not probed.stopped_early and probed == whole
    monkeypatch.setattr("analysis.capacity.point.PROBE_MIN_REQUESTS", 0)  # without the guard it would have stopped
    assert evaluate_point(small_trace, short, SLOS, PointJob(BASE, 200.0, 0)).stopped_early


def _next_round(config, search):
    """The sweep's own rule for a search's next jobs (run_sweep's next_round), for one seed-0 search."""
    from analysis.capacity.point import PointJob

    probe = search.highest_pass is None
    jobs = [PointJob(config, qps, 0, probe=probe, certain_miss=not probe) for qps in search.propose()]
    if search.done and search.outcome().max_qps is not None:
        jobs.append(PointJob(config, search.outcome().max_qps, 0, duration_scale=2.0, probe=False, certain_miss=True))
    return jobs


def test_jobs_run_ahead_are_the_next_rounds_of_each_verdict_likelier_first() -> None:
    from analysis.capacity.bisection import CapacitySearch
    from analysis.capacity.speculation import jobs_ahead

    search = CapacitySearch(SearchParams(start_qps=10.0, tolerance=0.1, max_iterations=8))
    (first,) = _next_round(BASE, search)
    ahead = jobs_ahead(search, [first], 0, lambda s: _next_round(BASE, s), MAX_DURATION_CHECKS)
    # 10 passes: 20 (no probe once a load passed); fails: 5, probed. Then 20 passes: 40, fails: 15; and below 5,
    # where everything tried failed, a failure first (2.5, still probed) and then a pass (7.5, between 5 that passed
    # and 10 that failed).
    assert [(job.qps, job.probe, job.certain_miss) for job in ahead] == [
        (20.0, False, True), (5.0, True, False), (40.0, False, True), (15.0, False, True), (2.5, True, False),
        (7.5, False, True)]
    assert search.pending == (10.0,) and search.num_evaluated == 0  # looked ahead on copies only


def test_runs_ahead_of_a_check_twice_as_long_and_to_the_check_of_a_closing_bracket() -> None:
    from analysis.capacity.bisection import CapacitySearch
    from analysis.capacity.speculation import jobs_ahead

    def ahead(search, in_flight, num_checks=0):
        return [(job.qps, job.duration_scale, job.probe) for job in
                jobs_ahead(search, [in_flight], num_checks, lambda s: _next_round(BASE, s), MAX_DURATION_CHECKS)]

    search = CapacitySearch(SearchParams(qps_min=10.0, qps_max=11.0, tolerance=0.2, max_iterations=8))
    search.propose()
    search.observe({10.0: True, 11.0: False})  # closed: its answer 10 is checked on a stream twice as long
    (check,) = _next_round(BASE, search)
    assert (check.qps, check.duration_scale) == (10.0, 2.0)
    # Confirmed, the search ends; failed, 10 counts as failed and the search halves to 5 (probed: nothing passed),
    # which passing leads to 7.5 and failing ends (even --qps-min failed).
    assert ahead(search, check) == [(5.0, 1.0, True), (7.5, 1.0, False)]
    assert ahead(search, check, num_checks=MAX_DURATION_CHECKS - 1) == []  # the last check allowed: nothing after

    search = CapacitySearch(SearchParams(qps_min=10.0, qps_max=20.0, tolerance=0.2, max_iterations=8))
    search.propose()
    search.observe({10.0: True, 20.0: False})
    (point,) = _next_round(BASE, search)
    assert point.qps == 15.0
    # 17.5 or 12.5; then 17.5 closes the bracket either way (its check at 17.5 or at 15), and 12.5 passing closes it.
    assert ahead(search, point) == [(17.5, 1.0, False), (12.5, 1.0, False), (17.5, 2.0, False), (15.0, 2.0, False),
                                    (12.5, 2.0, False), (11.25, 1.0, False)]


def test_a_sweep_that_runs_jobs_ahead_on_idle_workers_answers_as_a_serial_one(small_trace) -> None:
    configs = expand_configs(BASE, {})
    serial = run_sweep(configs, PARAMS, SerialExecutor(small_trace, WORKLOAD, SLOS))
    counts: dict = {}
    ahead = run_sweep(configs, PARAMS, LocalExecutor(small_trace, WORKLOAD, SLOS, num_jobs=3), run_ahead_counts=counts)
    assert [r.searches for r in serial] == [r.searches for r in ahead]
    assert counts["run_ahead"] >= counts["used"] > 0  # jobs were taken from those run ahead


def test_a_local_pool_stops_a_dropped_job_that_runs_already(small_trace) -> None:
    """A job run ahead that no search took keeps its worker only until its next request finishes."""
    import time

    from analysis.capacity.executors import JobDropped
    from analysis.capacity.point import PointJob

    executor = LocalExecutor(small_trace, WorkloadParams(min_duration_s=7200.0, min_requests=150), SLOS, num_jobs=1)
    try:
        waiting = executor.submit(PointJob(BASE, 2.0, 0, probe=False))  # two hours of arrivals: seconds to simulate
        # The pool hands its call queue a job more than its workers, marked running as it does (not cancellable):
        # two behind the first, so that the next one surely waits (with one behind, whether it could still be
        # cancelled depended on the pool's thread, and the test failed on a loaded machine).
        handed = [executor.submit(PointJob(BASE, 2.0, seed, probe=False)) for seed in (1, 2)]
        queued = executor.submit(PointJob(BASE, 2.0, 3, probe=False))
        deadline = time.monotonic() + 120
        while not waiting.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting.running()
        for future in handed:
            executor.drop(future)
        assert executor.drop(queued) and queued.cancelled()  # never started
        dropped_at = time.monotonic()
        assert not executor.drop(waiting)
        with pytest.raises(JobDropped, match="dropped"):
            waiting.result(timeout=60)
        assert time.monotonic() - dropped_at < 30
    finally:
        executor.close(interrupted=True)
