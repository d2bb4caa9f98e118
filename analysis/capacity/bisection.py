"""Search for the highest load (QPS) that passes a yes/no test, one configuration at a time.

The search is a state machine (`propose` the next QPS values, `observe` their verdicts) rather
than a loop that calls a simulator, so a sweep can interleave many configurations' searches over
one process pool, and a test can drive it with a plain function. Its decisions depend only on the
verdicts, never on timing, so a sweep gives the same answer serially, on many cores or on Ray.

Strategy: first a bracket [lo passes, hi fails]: from `--qps-min`/`--qps-max` when given, else from
a start rate (the trace's own), doubling while it passes or halving while it fails. Then bisect
until (hi - lo) / lo <= tolerance. With `candidates_per_round = k > 1`, k evenly spaced points of
the bracket are tried per round (k-section), which uses k cores for one configuration. Every
simulation counts towards `max_iterations`.

A finite trace rescaled to ever higher QPS degenerates into one burst: once a passing QPS already
delivers the whole trace in a small fraction of the replay (the caller says so by passing it in
`bursts`), going higher cannot show a limit, so the upward search stops there and says so.

Bisection assumes latency grows with load. When a tried QPS passed although a lower one failed,
the outcome says so (`monotone = False`) and keeps the bracket below the first failure.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from analysis.stats import round_sig

# A start rate people can read: 5.98, not 5.976309267816164.
START_SIGNIFICANT_DIGITS = 3
# Candidates are rounded so outputs read 43.355, not 43.355000000000004; far finer than any tolerance.
CANDIDATE_SIGNIFICANT_DIGITS = 6
MIN_TOLERANCE = 1e-4  # finer brackets would be lost to that rounding (and to simulation noise)


@dataclass(frozen=True)
class SearchParams:
    """How to search one configuration; `start_qps` is used only when neither bound is given."""

    start_qps: float = 1.0
    qps_min: float | None = None
    qps_max: float | None = None
    tolerance: float = 0.05
    max_iterations: int = 20
    candidates_per_round: int = 1
    # The lowest QPS halving downwards may try (WorkloadParams.min_qps): an unreachable SLO halved on until the
    # stream's arrivals passed a trace's bound and the sweep ended in a traceback.
    qps_floor: float = 0.0
    # The highest QPS whose stream one simulation takes (workload.max_stream_qps): doubling upwards past it ended
    # the sweep in an error, after every simulation, when short streams met the SLOs at every load.
    qps_ceiling: float = math.inf

    def __post_init__(self) -> None:
        for name in ("start_qps", "qps_min", "qps_max"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        if self.qps_min is not None and self.qps_max is not None and not self.qps_min < self.qps_max:
            raise ValueError(f"--qps-min ({self.qps_min}) must be below --qps-max ({self.qps_max})")
        if not self.qps_ceiling > 0:  # NaN too: no doubling would ever be tried
            raise ValueError(f"the QPS ceiling must be > 0, got {self.qps_ceiling}")
        if not (math.isfinite(self.tolerance) and MIN_TOLERANCE <= self.tolerance < 1):
            raise ValueError(f"--tolerance must be in [{MIN_TOLERANCE}, 1), got {self.tolerance}")
        if self.max_iterations < 1:
            raise ValueError(f"--max-iterations must be >= 1, got {self.max_iterations}")
        if self.candidates_per_round < 1:
            raise ValueError(f"--candidates-per-round must be >= 1, got {self.candidates_per_round}")


@dataclass(frozen=True)
class SearchOutcome:
    """`max_qps`: highest QPS that passed below the first failure (None: none passed).

    `points` holds (qps, passed) in the order tried; `converged` says the bracket closed to the
    tolerance; `notes` explains anything a reader should know (unclosed bracket, non-monotone).
    """

    max_qps: float | None
    points: tuple[tuple[float, bool], ...]
    converged: bool
    monotone: bool
    notes: tuple[str, ...] = field(default=())


class CapacitySearch:
    """One configuration's search; call `propose` then `observe` until `done`."""

    def __init__(self, params: SearchParams) -> None:
        self.params = params
        self._verdicts: dict[float, bool] = {}
        self._order: list[float] = []
        self._pending: list[float] = []
        self._bursts: set[float] = set()
        self._lo: float | None = None  # highest QPS known to pass (below every known failure)
        self._hi: float | None = None  # lowest QPS known to fail
        self._done = False
        self._notes: list[str] = []
        self._revised: list[float] = []  # passed, then failed a longer simulation (see revise)
        self._load_independent: dict[float, str] = {}  # failures a lower load repeats (see observe)

    # ---- the protocol -----------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done

    @property
    def pending(self) -> tuple[float, ...]:
        """The values proposed and not yet observed."""
        return tuple(self._pending)

    @property
    def num_evaluated(self) -> int:
        return len(self._order)

    @property
    def highest_pass(self) -> float | None:
        """The highest QPS known to pass below every known failure (None while none has)."""
        return self._lo

    def propose(self) -> list[float]:
        """QPS values to evaluate next (all may run at once); empty when done or waiting."""
        if self._done or self._pending:
            return []
        budget = self.params.max_iterations - self.num_evaluated
        if budget <= 0:
            self._finish(converged=False)
            return []
        candidates = self._next_candidates(budget)
        candidates = [q for q in candidates if q not in self._verdicts]
        if not candidates:
            self._finish(converged=self._closed())
            return []
        self._pending = candidates
        return list(candidates)

    def observe(self, verdicts: Mapping[float, bool], bursts: Collection[float] = (),
                load_independent: Mapping[float, str] | None = None) -> None:
        """Record verdicts of the proposed values (all of them, in any order).

        `bursts`: proposed values at which the trace arrived as (nearly) one burst. `load_independent`: proposed
        values that failed with the same statistics as the failure above them, each with what stayed the same: the
        load no longer moves them (requests no longer wait for each other), so halving on cannot pass and only
        spent --max-iterations before advising to raise it.
        """
        missing = [q for q in self._pending if q not in verdicts]
        if missing:
            raise ValueError(f"no verdict for proposed QPS {missing}")
        for qps in self._pending:
            self._verdicts[qps] = bool(verdicts[qps])
            self._order.append(qps)
            if qps in bursts:
                self._bursts.add(qps)
            if load_independent and qps in load_independent and not verdicts[qps]:
                self._load_independent[qps] = load_independent[qps]
        self._pending = []
        self._update_bracket()
        if self._closed():
            self._finish(converged=True)
        elif self._lo is None and self._hi in self._load_independent:
            self._finish(converged=False)  # a lower load fails alike
        elif self._lo is None and self._hi is not None and self._has_bound("qps_min"):
            self._finish(converged=False)  # even --qps-min fails
        elif self._hi is None and self._lo is not None and self._lo in (self.params.qps_max, *self._bursts):
            # --qps-max itself passed, or the trace is too short to load it further. Not merely "a bound is given":
            # with --max-iterations 1 only --qps-min was tried, and the search ended saying --qps-max had passed.
            self._finish(converged=False)

    def revise(self, qps: float) -> None:
        """A longer simulation of `qps`, which passed, failed: count it as a failure and search on below it.

        The search is done again when the bracket below `qps` is already closed; otherwise it proposes more
        values (halving when nothing below passed).
        """
        if qps not in self._verdicts or not self._verdicts[qps]:
            raise ValueError(f"only a passing QPS can be revised, not {qps}")
        self._verdicts[qps] = False
        self._revised.append(qps)
        self._done = False
        self._notes = []
        self._update_bracket()
        if self._closed():
            self._finish(converged=True)
        # otherwise propose() goes on: bisecting below `qps`, or halving when nothing passes any more

    def outcome(self) -> SearchOutcome:
        if not self._done:
            raise RuntimeError("the search is not finished")
        return SearchOutcome(
            max_qps=self._lo,
            points=tuple((q, self._verdicts[q]) for q in self._order),
            converged=self._converged,
            monotone=self._monotone(),
            notes=tuple(self._notes),
        )

    # ---- internals --------------------------------------------------------------------------
    def _has_bound(self, name: str) -> bool:
        return getattr(self.params, name) is not None

    def _closed(self) -> bool:
        lo, hi = self._lo, self._hi
        return lo is not None and hi is not None and (hi - lo) / lo <= self.params.tolerance

    def _next_candidates(self, budget: int) -> list[float]:
        p = self.params
        if not self._order:  # the first round: the bounds given, else the start rate
            bounds = [float(q) for q in (p.qps_min, p.qps_max) if q is not None]
            return bounds[:budget] or [float(p.start_qps)]
        lo, hi = self._lo, self._hi
        if hi is None:  # everything passed so far: go up, not above the ceiling (then the search ends)
            higher = round_sig(lo * 2.0, CANDIDATE_SIGNIFICANT_DIGITS)
            return [higher] if higher <= p.qps_ceiling else []
        if lo is None:  # everything failed so far: go down, not below the floor (then the search ends)
            lower = round_sig(hi / 2.0, CANDIDATE_SIGNIFICANT_DIGITS)
            return [lower] if lower >= p.qps_floor else []
        k = min(p.candidates_per_round, budget)
        return [round_sig(lo + (hi - lo) * i / (k + 1), CANDIDATE_SIGNIFICANT_DIGITS) for i in range(1, k + 1)]

    def _update_bracket(self) -> None:
        failures = [q for q, ok in self._verdicts.items() if not ok]
        self._hi = min(failures) if failures else None
        passes = [q for q, ok in self._verdicts.items() if ok and (self._hi is None or q < self._hi)]
        self._lo = max(passes) if passes else None

    def _monotone(self) -> bool:
        return self._hi is None or all(q < self._hi for q, ok in self._verdicts.items() if ok)

    def _finish(self, converged: bool) -> None:
        self._done = True
        self._converged = converged
        p = self.params
        if self._revised:
            self._notes.append(f"{', '.join(f'{q:.4g}' for q in self._revised)} req/s passed but failed on a stream "
                               "twice as long, so counted as failed")
        if self._lo is None:
            if any(self._verdicts.values()):
                self._notes.append(f"no QPS below the first failure ({self._hi:.4g} req/s) met the SLOs")
            elif self._order:
                self._notes.append(self._none_passed_note(min(self._order)))
        elif self._hi is None and self._lo in self._bursts:
            self._notes.append(
                f"capacity is at least {self._lo:.4g} req/s: at that rate the trace arrives as one burst and still "
                "met the SLOs, so it is too short to load this configuration further; use more requests"
            )
        elif self._hi is None and round_sig(self._lo * 2.0, CANDIDATE_SIGNIFICANT_DIGITS) > p.qps_ceiling:
            self._notes.append(
                f"capacity is at least {self._lo:.4g} req/s: every QPS tried met the SLOs, and a stream above "
                f"{p.qps_ceiling:.4g} req/s would hold more requests than one simulation takes, so the search "
                "stopped there (streams of a few requests may never load the configuration: see --min-requests "
                "and --min-duration-s)")
        elif self._hi is None:
            if self._lo == p.qps_max:
                bound, advice = "--qps-max", "raise --qps-max"
            else:  # the budget ran out below --qps-max (or with none given): it was never tried
                bound = "the highest QPS tried"
                advice = "raise --max-iterations" + (" or set --qps-max" if p.qps_max is None else "")
            self._notes.append(f"capacity is at least {self._lo:.4g} req/s ({bound} met the SLOs); {advice}")
        elif not converged:
            precision = (self._hi - self._lo) / self._lo
            self._notes.append(
                f"stopped after --max-iterations={p.max_iterations} simulations with the bracket "
                f"[{self._lo:.4g}, {self._hi:.4g}] req/s ({precision:.1%} wide, tolerance {p.tolerance:.1%})"
            )
        if not self._monotone():
            above = sorted(q for q, ok in self._verdicts.items() if ok and q > self._hi)
            self._notes.append(
                f"non-monotone: {', '.join(f'{q:.4g}' for q in above)} req/s met the SLOs although "
                f"{self._hi:.4g} req/s did not; bisection assumes latency grows with load, so max_qps is "
                "the highest passing QPS below the first failure"
            )

    def _none_passed_note(self, lowest: float) -> str:
        """Why no QPS passed, when every one tried failed, and what (if anything) would help."""
        p = self.params
        if lowest in self._load_independent:  # "raise --max-iterations" would only repeat the failure lower down
            return (f"no QPS can meet the SLOs: {self._load_independent[lowest]}, so requests no longer wait for each "
                    "other there and a lower load fails alike: the SLOs are tighter than the configuration serves a "
                    "request alone")
        if p.qps_min is not None:
            advice = "lower --qps-min"
        elif round_sig(lowest / 2.0, CANDIDATE_SIGNIFICANT_DIGITS) < p.qps_floor:
            advice = (f"a QPS below {p.qps_floor:.3g} req/s would spread --min-requests over longer than "
                      "a trace may last")
        else:
            advice = "raise --max-iterations or set --qps-min"
        return f"no QPS tried met the SLOs (lowest tried: {lowest:.4g} req/s); {advice}"
