"""Simulations run ahead of a search's verdicts, on workers the sweep would leave idle.

A bisection is sequential: each QPS it tries depends on the verdict before. One configuration on one seed (the
default sweep) therefore kept one process busy however many cores the machine had. While a round is in flight, the
jobs the search would submit next are known for each verdict it may get (pass: the next QPS up or the next
bisection point, or the check of the answer on a stream twice as long; fail: the next one down), and so on one level
further. Idle workers simulate those ahead (`jobs_ahead`, most likely first); when the verdict comes, the job the
search really submits is taken from them if it is there (same QPS, stream length, early-stop options: the very
simulation it would have run), and the others are dropped (`Executor.drop`: a local pool's worker stops one that
runs already at its next finished request).

Answers are the same as a serial sweep's, point for point: only jobs the search itself submits are ever looked at,
and a job's result depends on the job alone. What it costs is CPU time on cores that would have idled: the wrong
branch's simulations. `benchmarks/capacity_speed.py --jobs N` measures the wall time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from analysis.capacity.bisection import CapacitySearch
from analysis.capacity.point import PointJob

# Verdicts looked ahead: one level uses up to 2 more workers per search, two levels up to 6. Deeper levels would
# mostly simulate branches that are not taken (each level halves the chance of a job being used).
SPECULATION_DEPTH = 2


def workers_per_search(candidates_per_round: int) -> int:
    """The most workers one search can keep busy: its round, plus (for plain bisection) the jobs run ahead."""
    if candidates_per_round > 1:  # k-section rounds are not run ahead: they already use k workers
        return candidates_per_round
    return 2 ** (SPECULATION_DEPTH + 1) - 1


def job_identity(job: PointJob) -> tuple:
    """What makes two jobs of one search the same simulation (their configuration and seed are the search's)."""
    return job.qps, job.duration_scale, job.band_replay, job.probe, job.certain_miss


def jobs_ahead(search: CapacitySearch, in_flight: Sequence[PointJob], num_checks: int,
               next_round: Callable[[CapacitySearch], list[PointJob]], max_checks: int,
               depth: int = SPECULATION_DEPTH) -> list[PointJob]:
    """The jobs ``search`` may submit after the verdicts of up to ``depth`` rounds, the one ``in_flight`` first,
    nearest rounds first and the likelier verdict first within each. ``next_round`` gives the jobs the sweep submits
    for a search that just got its verdicts (it proposes on the copy it is given); ``num_checks`` counts the checks
    on a stream twice as long already back, of at most ``max_checks``. Only rounds of one job branch (a k-section
    round's 2**k verdict combinations are not run ahead)."""
    found: list[PointJob] = []
    seen: set[tuple] = set()
    frontier = [(search, list(in_flight), num_checks)]
    for _ in range(depth):
        children = []
        for state, jobs, checks in frontier:
            if len(jobs) != 1:
                continue
            (job,) = jobs
            for passed in _likely_first(state, job):
                child = copy.deepcopy(state)
                if job.duration_scale == 1.0:
                    child.observe({job.qps: passed})
                    child_checks = checks
                elif passed or checks + 1 >= max_checks:  # confirmed, or the last check failed: the search ends
                    continue
                else:  # failed twice as long: searched on below it, as the sweep does
                    child.revise(job.qps)
                    child_checks = checks + 1
                round_jobs = next_round(child)
                for round_job in round_jobs:
                    if job_identity(round_job) not in seen:
                        seen.add(job_identity(round_job))
                        found.append(round_job)
                children.append((child, round_jobs, child_checks))
        frontier = children
    return found


def _likely_first(search: CapacitySearch, job: PointJob) -> tuple[bool, bool]:
    """The verdict to run ahead for first: a check on a longer stream mostly confirms, which ends the search (the
    failure branch is the one with jobs); while everything tried failed the search is halving down from far above
    capacity, where the next load mostly fails too; otherwise (doubling up, or bisecting) a pass first."""
    if job.duration_scale != 1.0:
        return (False, True)
    if search.highest_pass is None and search.num_evaluated > 0:
        return (False, True)
    return (True, False)
