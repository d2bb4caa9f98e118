"""The capacity search (analysis.capacity.bisection) on synthetic pass/fail functions, with exact expectations."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from analysis.capacity.bisection import CapacitySearch, SearchOutcome, SearchParams


def below(limit: float):
    return lambda qps: qps <= limit


def run_search(
    params: SearchParams,
    passes: Callable[[float], bool],
    is_burst: Callable[[float], bool] = lambda qps: False,
) -> SearchOutcome:
    """Run a whole search serially against `passes(qps)`."""
    search = CapacitySearch(params)
    while not search.done:
        candidates = search.propose()
        if candidates:
            search.observe({q: passes(q) for q in candidates}, {q for q in candidates if is_burst(q)})
    return search.outcome()


def test_doubles_then_bisects_to_the_tolerance() -> None:
    outcome = run_search(SearchParams(start_qps=1.0, tolerance=0.05), below(7.3))
    assert outcome.points == (
        (1.0, True), (2.0, True), (4.0, True), (8.0, False),  # bracket [4, 8]
        (6.0, True), (7.0, True), (7.5, False), (7.25, True),  # (7.5 - 7.25) / 7.25 <= 5 %
    )
    assert outcome.max_qps == 7.25
    assert outcome.converged and outcome.monotone and outcome.notes == ()


def test_halves_when_the_start_fails() -> None:
    outcome = run_search(SearchParams(start_qps=40.0, tolerance=0.1), below(7.3))
    assert [q for q, _ in outcome.points] == [40.0, 20.0, 10.0, 5.0, 7.5, 6.25, 6.875]
    assert outcome.max_qps == 6.875  # (7.5 - 6.875) / 6.875 = 9.1 % <= 10 %
    assert outcome.converged


def test_halving_stops_at_the_floor() -> None:
    """An SLO no QPS meets halved on until the stream's arrivals overflowed a trace's bound (a traceback): the floor
    (WorkloadParams.min_qps) ends the search, saying why."""
    outcome = run_search(SearchParams(start_qps=40.0, max_iterations=60, qps_floor=4.0), lambda qps: False)
    assert [q for q, _ in outcome.points] == [40.0, 20.0, 10.0, 5.0]  # 2.5 is below the floor
    assert outcome.max_qps is None and not outcome.converged
    assert outcome.notes == ("no QPS tried met the SLOs (lowest tried: 5 req/s); a QPS below 4 req/s would spread "
                             "--min-requests over longer than a trace may last",)
    # the floor only stops the downward search: with a pass above it bisection goes on as before
    outcome = run_search(SearchParams(start_qps=40.0, tolerance=0.1, qps_floor=4.0), below(7.3))
    assert [q for q, _ in outcome.points] == [40.0, 20.0, 10.0, 5.0, 7.5, 6.25, 6.875]


def test_explicit_bracket() -> None:
    outcome = run_search(SearchParams(qps_min=2.0, qps_max=10.0, tolerance=0.2), below(7.3))
    assert outcome.points == ((2.0, True), (10.0, False), (6.0, True), (8.0, False), (7.0, True))
    assert outcome.max_qps == 7.0


def test_k_section_tries_several_candidates_per_round() -> None:
    params = SearchParams(start_qps=1.0, tolerance=0.05, candidates_per_round=3)
    search = CapacitySearch(params)
    rounds = []
    while not search.done:
        candidates = search.propose()
        if candidates:
            rounds.append(candidates)
            search.observe({q: q <= 7.3 for q in candidates})
    assert rounds == [[1.0], [2.0], [4.0], [8.0], [5.0, 6.0, 7.0], [7.25, 7.5, 7.75]]
    assert search.outcome().max_qps == 7.25


def test_non_monotone_results_are_reported_not_fatal() -> None:
    # Passes up to 5.3 and again in (6.5, 7]: the k-section round [5, 6, 7] sees 7 pass after 6 failed.
    outcome = run_search(
        SearchParams(start_qps=1.0, tolerance=0.05, candidates_per_round=3),
        lambda q: q <= 5.3 or 6.5 < q <= 7.0,
    )
    assert not outcome.monotone
    assert outcome.max_qps == 5.25  # the bracket stays below the first failure
    assert any(note.startswith("non-monotone: 7 req/s met the SLOs although 5.5 req/s did not")
               for note in outcome.notes)


def test_a_passing_upper_bound_and_a_failing_lower_bound_end_the_search() -> None:
    high = run_search(SearchParams(qps_min=1.0, qps_max=4.0), below(7.3))
    assert high.points == ((1.0, True), (4.0, True))
    assert high.max_qps == 4.0 and not high.converged
    assert high.notes == ("capacity is at least 4 req/s (--qps-max met the SLOs); raise --qps-max",)
    low = run_search(SearchParams(qps_min=8.0, qps_max=16.0), below(7.3))
    assert low.max_qps is None
    assert low.notes == ("no QPS tried met the SLOs (lowest tried: 8 req/s); lower --qps-min",)
    inverted = run_search(SearchParams(qps_min=1.0, qps_max=4.0), lambda q: q > 2)
    assert inverted.max_qps is None and not inverted.monotone


def test_max_iterations_caps_the_simulations() -> None:
    outcome = run_search(SearchParams(start_qps=1.0, tolerance=0.001, max_iterations=6), below(7.3))
    assert len(outcome.points) == 6
    assert outcome.max_qps == 7.0 and not outcome.converged
    assert outcome.notes[0].startswith("stopped after --max-iterations=6 simulations with the bracket [7, 8] req/s")
    none = run_search(SearchParams(start_qps=100.0, max_iterations=3), below(7.3))
    assert none.max_qps is None and [q for q, _ in none.points] == [100.0, 50.0, 25.0]


def test_a_passing_burst_stops_the_upward_search() -> None:
    outcome = run_search(SearchParams(start_qps=1.0), lambda q: True, is_burst=lambda q: q >= 8)
    assert [q for q, _ in outcome.points] == [1.0, 2.0, 4.0, 8.0]
    assert outcome.max_qps == 8.0 and not outcome.converged
    assert "arrives as one burst" in outcome.notes[0]


def test_candidates_are_rounded_to_readable_values() -> None:
    outcome = run_search(SearchParams(start_qps=5.98, tolerance=0.01), below(43.4))
    assert all(len(f"{q:.15g}".replace(".", "").lstrip("0")) <= 6 for q, _ in outcome.points)
    assert 43.4 * 0.99 <= outcome.max_qps <= 43.4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(start_qps=0.0), "--start-qps must be a finite number > 0"),
        (dict(qps_min=5.0, qps_max=5.0), r"--qps-min \(5.0\) must be below --qps-max \(5.0\)"),
        (dict(tolerance=0.0), r"--tolerance must be in \[0.0001, 1\)"),
        (dict(max_iterations=0), "--max-iterations must be >= 1"),
        (dict(candidates_per_round=0), "--candidates-per-round must be >= 1"),
    ],
)
def test_bad_search_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SearchParams(**kwargs)


def test_observe_needs_every_proposed_verdict() -> None:
    search = CapacitySearch(SearchParams(qps_min=1.0, qps_max=2.0))
    assert search.propose() == [1.0, 2.0]
    assert search.propose() == []  # waiting for verdicts
    with pytest.raises(ValueError, match="no verdict"):
        search.observe({1.0: True})


def _finish(search: CapacitySearch, passes: Callable[[float], bool]) -> SearchOutcome:
    while not search.done:
        search.observe({q: passes(q) for q in search.propose()})
    return search.outcome()


def test_a_revised_answer_counts_as_failed_and_the_search_goes_on_below() -> None:
    search = CapacitySearch(SearchParams(start_qps=1.0, tolerance=0.01))
    assert _finish(search, below(7.3)).max_qps == 7.25
    search.revise(7.25)  # it failed on a stream twice as long
    assert not search.done
    outcome = _finish(search, below(7.3))
    assert dict(outcome.points)[7.25] is False
    assert outcome.points[-2:] == ((7.125, True), (7.1875, True))  # bisected between 7 and 7.25
    assert outcome.max_qps == 7.1875 and outcome.converged
    assert outcome.notes == ("7.25 req/s passed but failed on a stream twice as long, so counted as failed",)
    search.revise(7.1875)  # [7.125, 7.1875] is already within 1 %: done at once
    assert search.done and search.outcome().max_qps == 7.125
    with pytest.raises(ValueError, match="only a passing QPS can be revised"):
        search.revise(7.5)


def test_revising_the_only_pass_halves_again() -> None:
    search = CapacitySearch(SearchParams(start_qps=4.0, tolerance=0.05))
    assert search.propose() == [4.0]
    search.observe({4.0: True})
    assert search.propose() == [8.0]
    search.observe({8.0: False})
    search.revise(4.0)
    assert search.propose() == [2.0]
