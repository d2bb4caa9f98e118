"""Run many capacity searches at once: the cross product of options, each bisected on QPS, per seed.

The process that drives the sweep holds one `CapacitySearch` per (configuration, seed) and sends
single simulations (`PointJob`: one configuration at one QPS on one seed's stream) to an executor:
in-process, a local process pool, or a Ray cluster. A search only ever sees its own verdicts, so
completion order cannot change any decision and the results are identical whatever `--jobs` or
executor ran them. When a search ends, its answer is simulated once more on a stream twice as long
(the T-versus-2T check).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

import numpy as np

from analysis.capacity.bisection import CapacitySearch, SearchOutcome, SearchParams
from analysis.capacity.point import PROBE_MIN_REQUESTS, PointJob, PointResult
from analysis.capacity.speculation import job_identity, jobs_ahead
from analysis.capacity.stability import NUM_BACKLOG_SAMPLES
from analysis.capacity.workload import MAX_STREAM_REQUESTS, WorkloadParams
from analysis.process_pools import interrupts_held
from engine.core.config import ConfigError
from engine.core.config_args import flag_of
from engine.core.messages import counted
from sim.config import SimConfig

# SimConfig field -> the CLI option that lists its values; the cross product follows this order.
SWEEP_AXES: dict[str, str] = {
    name: flag_of(SimConfig.__dataclass_fields__[name])
    for name in ("model", "gpu", "num_replicas", "tensor_parallel_size", "policy", "max_num_seqs", "router")
}
# SimConfig field -> how a chart label shows its value.
_LABEL_FORMATS: dict[str, str] = {"model": "{}", "gpu": "{}", "num_replicas": "x{}", "tensor_parallel_size": "tp{}",
                                  "policy": "{}", "max_num_seqs": "seqs{}", "router": "router {}"}
class SweepError(Exception):
    """A sweep that cannot start (bad options, missing Ray); the message names the option."""


# Each configuration is a whole search (up to --max-iterations simulations of thousands of requests, seconds each):
# --replicas 1,...,300 --max-num-seqs 1,...,300 (90,000 of them) spent minutes planning and would have swept for
# weeks. A thousand is already hours on a large machine.
MAX_CONFIGS = 1000


def expand_configs(base: SimConfig, axes: Mapping[str, Sequence]) -> list[SimConfig]:
    """Every combination of `axes` (SimConfig field -> values) applied to `base`, in SWEEP_AXES order.

    Fields not in `axes` keep `base`'s value; an empty list of values is an error naming its option.
    """
    unknown = [name for name in axes if name not in SWEEP_AXES]
    if unknown:
        raise SweepError(f"cannot sweep {', '.join(unknown)}; sweepable: {', '.join(SWEEP_AXES)}")
    names = [name for name in SWEEP_AXES if name in axes]
    for name in names:
        if len(axes[name]) == 0:
            raise SweepError(f"{SWEEP_AXES[name]}: empty list; give at least one value")
    num_configs = math.prod(len(axes[n]) for n in names)
    if num_configs > MAX_CONFIGS:
        lists = " x ".join(f"{SWEEP_AXES[n]} ({len(axes[n])})" for n in names if len(axes[n]) > 1)
        raise SweepError(f"{lists} make {num_configs:,} configurations; expected at most {MAX_CONFIGS:,} in one sweep "
                         "(each is a search of up to --max-iterations simulations): sweep fewer values")
    try:
        return [dataclasses.replace(base, **dict(zip(names, values)))
                for values in itertools.product(*(axes[n] for n in names))]
    except ConfigError as exc:  # a later value of a list (--replicas 1,20000): name its option as build_config does
        if exc.field not in SWEEP_AXES:
            raise
        raise SweepError(f"{SWEEP_AXES[exc.field]}: {exc}") from None


def config_label(config: SimConfig, varying: Iterable[str] | None = None) -> str:
    """A short name for charts: the swept options that differ between configurations.

    With nothing varying, the model, GPU and replica count, so a one-configuration sweep still
    reads well.
    """
    names = [n for n in SWEEP_AXES if n in set(varying or ())] or ["model", "gpu", "num_replicas"]
    return _options_text(config, names)


def family_label(config: SimConfig, varying: Iterable[str]) -> str:
    """`config_label` without the replica count: names a family measured at several counts."""
    names = [n for n in SWEEP_AXES if n in set(varying) and n != "num_replicas"] or ["model", "gpu"]
    return _options_text(config, names)


def _options_text(config: SimConfig, names: Iterable[str]) -> str:
    return " ".join(_LABEL_FORMATS[name].format(getattr(config, name)) for name in names)


def search_identity(config: SimConfig) -> SimConfig:
    """What a search of ``config`` simulates: with one replica every request goes to it whichever the router, so
    configurations that differ only by router are one search (--replicas 1,2 --router rr,lor searched the
    one-replica configuration once per router, each time with the same verdicts)."""
    if config.num_replicas == 1:
        return dataclasses.replace(config, router=SimConfig.__dataclass_fields__["router"].default)
    return config


def varying_axes(configs: Sequence[SimConfig]) -> list[str]:
    """The sweepable fields that take more than one value among `configs`."""
    return [n for n in SWEEP_AXES if len({getattr(c, n) for c in configs}) > 1]


@dataclass(frozen=True)
class SeedSearch:
    """One seed's search of one configuration: its outcome, the points tried (in order), and the answers
    simulated again on a stream twice as long (`checks`, in order; an answer that failed its check was
    counted as failed and the search went on below it, up to `MAX_DURATION_CHECKS` checks)."""

    seed: int
    outcome: SearchOutcome
    points: tuple[PointResult, ...]
    checks: tuple[PointResult, ...] = ()

    @property
    def check(self) -> PointResult | None:
        """The last T-versus-2T check (of max_qps, unless the checks ran out)."""
        return self.checks[-1] if self.checks else None

    @property
    def max_qps(self) -> float | None:
        return self.outcome.max_qps

    @property
    def kind(self) -> str:
        """What max_qps is: see `ANSWER_KINDS`."""
        outcome = self.outcome
        if outcome.max_qps is None:
            return "none"
        if all(ok for _, ok in outcome.points):
            return "lower_bound"
        if not outcome.converged:
            return "bracket"
        if self.check is None:  # --no-duration-check: converged, and nothing said of a longer stream
            return "unchecked"
        if not self.check.feasible or self.check.qps != outcome.max_qps:
            return "not_confirmed"
        return "converged"


# What a max_qps is, by SeedSearch.kind; only "converged" and "unchecked" are answers to plot as one.
ANSWER_KINDS: dict[str, str] = {
    "converged": "converged: the bracket closed to the tolerance and the answer held on a stream twice as long",
    "unchecked": ("converged, unchecked: the bracket closed to the tolerance; not simulated again on a stream twice "
                  "as long (--no-duration-check)"),
    "not_confirmed": "not confirmed: the answer missed an SLO or was unstable on a stream twice as long",
    "bracket": "not converged: the search stopped with a bracket wider than the tolerance",
    "lower_bound": "lower bound: every QPS tried passed, so capacity is at least this",
    "none": "no QPS tried passed",
}


# How a table shows a max QPS of each kind: never a bare number unless it is an answer.
_KIND_FORMATS: dict[str, str] = {"converged": "{}", "unchecked": "{}", "not_confirmed": "{}?", "bracket": "~{}",
                                 "lower_bound": ">={}"}
ANSWER = frozenset({"converged", "unchecked"})  # the kinds of max_qps that are answers (the user chose no 2T check)


def answer_text(max_qps: float | None, kind: str) -> str:
    """max_qps as a table shows it: ">=40" for a lower bound, "~40" for an open bracket, "40?" unconfirmed."""
    if max_qps is None:
        return "none"
    return _KIND_FORMATS[kind].format(f"{max_qps:.4g}")


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's searches (one per seed) and the answer: the median max QPS over seeds.

    With an even number of seeds the lower of the two middle values is taken, so the answer is
    always a QPS that was simulated (its point gives the latencies and token rate of the cost figures).
    A seed with no passing QPS counts as the lowest value.
    """

    index: int
    config: SimConfig
    label: str
    searches: tuple[SeedSearch, ...]
    notes: tuple[str, ...] = ()
    band_replays: bool = False  # each seed's search is a band replay (--bands): report p5-p95, not the range
    # The configuration whose searches these are (see `search_identity`), None where they were run for this one: its
    # simulations are reported with each configuration they answer for, and counted once in a run's total.
    same_search_as: int | None = None

    @property
    def median_search(self) -> SeedSearch:
        ranked = sorted(self.searches, key=lambda s: (-1.0 if s.max_qps is None else s.max_qps, s.seed))
        return ranked[(len(ranked) - 1) // 2]

    @property
    def max_qps(self) -> float | None:
        return self.median_search.max_qps

    @property
    def kind(self) -> str:
        """The answer's kind: the least certain of its seeds' (ANSWER_KINDS is ordered most certain first)."""
        kinds = {s.kind for s in self.searches}
        if self.max_qps is not None:
            # "none" is the kind of no max QPS: with --seeds 5, two seeds that found none and a median that is a QPS
            # made the kind "none" beside a number, and printing it was a KeyError traceback after every simulation
            # had run. Those seeds show as "some none" in the spread and in their notes; the kind is of the others.
            kinds.discard("none")
        return max(kinds, key=list(ANSWER_KINDS).index)

    @property
    def answer_text(self) -> str:
        return answer_text(self.max_qps, self.kind)

    @property
    def spread_text(self) -> str:
        """The seeds' range, e.g. "33.1-35.2" (empty with one seed); with band replays, their p5-p95."""
        if len(self.searches) < 2:
            return ""
        if self.spread is None:
            return "some none"
        low, high = (self.band["p5"], self.band["p95"]) if self.band_replays else self.spread
        return f"{low:.4g}-{high:.4g}"

    @property
    def band(self) -> dict[str, float] | None:
        """With band replays: the p5, median and p95 of their max QPS (None unless every replay found one), each a
        replay's own value as max_qps is: the median the lower middle one (max_qps itself), p5 and p95 taken
        outwards. Interpolated, as sim.replay's bands are, --bands 2 put max_qps (the lower replay) below its own
        p5 and beside a different median."""
        if not self.band_replays or self.spread is None:
            return None
        values = np.array([s.max_qps for s in self.searches], dtype=float)
        p5, p95 = np.percentile(values, 5, method="lower"), np.percentile(values, 95, method="higher")
        return {"median": self.max_qps, "p5": float(p5), "p95": float(p95)}

    @property
    def is_answer(self) -> bool:
        """max_qps is a converged capacity, confirmed on a stream twice as long unless that check was switched off
        (not a bound, bracket or unconfirmed value)."""
        return self.kind in ANSWER

    @property
    def max_qps_by_seed(self) -> dict[int, float | None]:
        return {s.seed: s.max_qps for s in self.searches}

    @property
    def spread(self) -> tuple[float, float] | None:
        """(lowest, highest) max QPS over seeds; None unless every seed found one."""
        values = [s.max_qps for s in self.searches]
        if any(v is None for v in values):
            return None
        return min(values), max(values)

    @property
    def outcome(self) -> SearchOutcome:
        return self.median_search.outcome

    @property
    def converged(self) -> bool:
        """Every seed's bracket closed to the tolerance. The median seed's alone said "converged": true beside a
        max_qps_kind of "bracket" (the least certain seed's, as `kind` takes it)."""
        return all(s.outcome.converged for s in self.searches)

    @property
    def monotone(self) -> bool:
        """No seed's search saw a load pass above one that failed (the median seed's alone hid another's)."""
        return all(s.outcome.monotone for s in self.searches)

    @property
    def points(self) -> tuple[PointResult, ...]:
        """The median seed's points, in the order tried."""
        return self.median_search.points

    @property
    def all_points(self) -> tuple[PointResult, ...]:
        return tuple(p for s in self.searches for p in s.points)

    @property
    def num_simulations(self) -> int:
        return sum(len(s.points) + len(s.checks) for s in self.searches)

    @property
    def num_simulations_run(self) -> int:
        """The simulations run for this configuration: none where it shares another's searches."""
        return self.num_simulations if self.same_search_as is None else 0

    @property
    def all_notes(self) -> tuple[str, ...]:
        notes = list(self.notes)
        for search in self.searches:
            prefix = f"seed {search.seed}: " if len(self.searches) > 1 else ""
            notes += [prefix + note for note in search.outcome.notes]
            if search.kind == "not_confirmed":
                notes.append(f"{prefix}{search.max_qps:.4g} req/s was not confirmed on a stream twice as long "
                             f"({len(search.checks)} check(s) failed): the answer depends on the simulated duration")
            answer = next((p for p in search.points if p.qps == search.max_qps), None)
            if answer is not None and answer.num_requests < ANSWER_MIN_REQUESTS:
                notes.append(f"{prefix}{search.max_qps:.4g} req/s was judged on only "
                             f"{counted(answer.num_requests, 'measured request')} (of "
                             f"{counted(answer.stream_requests, 'request')} simulated; the rest was warm-up, "
                             f"--warmup-fraction): SLO percentiles and the stability check over fewer than "
                             f"{ANSWER_MIN_REQUESTS} requests are noise, so the answer says little; raise "
                             "--min-requests or --min-duration-s, or lower --warmup-fraction")
        return tuple(notes)

    @property
    def point_at_max(self) -> PointResult | None:
        """The simulation at max_qps: the latencies and token rate the capacity figures use."""
        if self.max_qps is None:
            return None
        return next(p for p in self.points if p.qps == self.max_qps)


# An answer judged on fewer measured requests than this gets a note (in the printed table and capacity.json): a p90
# and the stability check over a handful of requests are noise, and stability never counts a shortfall of fewer than
# stability.NOISE_REQUESTS (a 100-request stream with --warmup-fraction 0.99 reported a capacity judged on 2 requests,
# one of them unfinished). The same minimum as the early-stop probe's; the defaults (3,000 requests, a quarter of
# warm-up) measure about 2,250. A note rather than a refusal: how many requests a window holds depends on the QPS
# (--min-duration-s), known only once simulated, and short streams are what the tests sweep.
ANSWER_MIN_REQUESTS = PROBE_MIN_REQUESTS


# Each failed T-versus-2T check sends the search below the answer; after this many the answer stays unconfirmed.
MAX_DURATION_CHECKS = 3


def shortened_notes(result: ConfigResult, workload: WorkloadParams) -> tuple[str, ...]:
    """Notes on the streams --max-requests shortened below --min-duration-s (none where it did not bind): how many
    simulations, and per seed whether its answer was judged on one, and whether that stream's measured window is
    long enough for the steady-state check. The check samples the backlog NUM_BACKLOG_SAMPLES times over the window
    and fits its trend; with samples closer together than a request's p99 end-to-end latency the trend reads requests
    in flight rather than a queue, so the verdict is called unreliable. A longer window only says a queue building
    faster than it would have shown; one building more slowly, or a transient longer than the window, is not seen."""
    simulations = [p for s in result.searches for p in (*s.points, *s.checks)]
    shortened = [p for p in simulations if workload.shortened(p.qps)]
    if not shortened:
        return ()
    above = workload.shortened_above_qps()
    notes = [f"{len(shortened)} of {counted(len(simulations), 'simulation')} ran a shortened stream: above "
             f"{above:.4g} req/s, --min-duration-s {workload.min_duration_s:g} s would hold more than --max-requests "
             f"{workload.max_requests:,} requests, so those streams last {workload.max_requests:,} / QPS seconds "
             "(a check of an answer twice that) and hold about that many"]
    for search in result.searches:
        answer = next((p for p in search.points if p.qps == search.max_qps), None)
        if answer is None or not workload.shortened(answer.qps):
            continue
        prefix = f"seed {search.seed}: " if len(result.searches) > 1 else ""
        window_s = answer.stream_duration_s - answer.warmup_s
        e2e_p99_ms = (answer.latency_ms.get("e2e_ms") or {}).get("p99")
        if e2e_p99_ms is None or e2e_p99_ms <= 0:
            steady = "no request finished to measure its latency by, so the steady-state check is unreliable"
        else:
            spans = window_s * 1000 / e2e_p99_ms
            if spans < NUM_BACKLOG_SAMPLES:
                steady = (f"that window spans only {spans:.3g} times the p99 end-to-end latency "
                          f"({e2e_p99_ms:.4g} ms): the steady-state check's {NUM_BACKLOG_SAMPLES} backlog samples are "
                          "closer together than a request takes, so its verdict that the load is sustained is "
                          "unreliable")
            else:
                steady = (f"that window spans {spans:.3g} times the p99 end-to-end latency ({e2e_p99_ms:.4g} ms), "
                          "so a queue building within it shows, but one building more slowly, or a transient longer "
                          f"than {window_s:.3g} s, would not")
        needed = answer.qps * workload.min_duration_s  # --min-duration-s 1e308: inf
        advice = (f"raise --max-requests (to {math.ceil(needed):,} at this QPS) to simulate --min-duration-s in full"
                  if needed <= MAX_STREAM_REQUESTS else
                  f"--min-duration-s at this QPS would hold {needed:.3g} requests, more than one simulation takes")
        notes.append(f"{prefix}the answer {answer.qps:.4g} req/s was judged on a stream of "
                     f"{answer.stream_duration_s:.4g} s, shortened by --max-requests {workload.max_requests:,} from "
                     f"--min-duration-s {workload.min_duration_s:g} s ({window_s:.4g} s measured, "
                     f"{answer.num_requests:,} request{'' if answer.num_requests == 1 else 's'}; its check twice "
                     f"that): {steady}; {advice}")
    return tuple(notes)


class Executor:
    """Runs `evaluate_point(library, workload, slos, job)` somewhere; `submit` returns a Future. One with a
    ``num_workers`` attribute (jobs that run at once) gets jobs run ahead of their verdicts on idle workers."""

    def submit(self, job: PointJob) -> Future:
        raise NotImplementedError

    def drop(self, future: Future) -> bool:
        """A job run ahead that no search took: cancelled when it has not started (True), else left to finish or
        stopped early, as the executor can (False)."""
        return future.cancel()

    def close(self, interrupted: bool = False) -> None:
        """Release workers; pending work is cancelled, and running work too when ``interrupted`` (Ctrl-C, a failed
        simulation, or jobs run ahead that no search took)."""


def superlinear_notes(results: Sequence[ConfigResult], tolerance: float) -> dict[int, str]:
    """Per configuration index: a note when it serves more per replica than the same options with fewer
    replicas, by more than `tolerance` (round-robin replicas cannot beat linear scaling)."""
    notes: dict[int, str] = {}
    families: dict[tuple, list[ConfigResult]] = {}
    for result in results:
        key = tuple(sorted((k, str(v)) for k, v in dataclasses.asdict(result.config).items() if k != "num_replicas"))
        families.setdefault(key, []).append(result)
    for members in families.values():
        members = sorted((r for r in members if r.max_qps), key=lambda r: r.config.num_replicas)
        for fewer, more in zip(members, members[1:]):
            ratio = more.max_qps / fewer.max_qps
            linear = more.config.num_replicas / fewer.config.num_replicas
            if ratio > linear * (1 + tolerance):
                notes[more.index] = (f"super-linear scaling: {more.config.num_replicas} replicas serve {ratio:.2f}x "
                                     f"what {fewer.config.num_replicas} serve (linear: {linear:.2f}x); suspect a "
                                     "transient (too short a stream) rather than capacity")
    return notes


def load_independent_failures(points: Mapping[float, PointResult], new: Iterable[float]) -> dict[float, str]:
    """Of the ``new`` points, those that failed exactly as the nearest failure above them did (see
    `same_failure`), each with what stayed the same: a statistic the load no longer moves cannot pass lower down,
    so a search halving towards it stops (an SLO below what one request alone takes halved 20 times, to 1e-5 req/s,
    and advised raising --max-iterations)."""
    new = set(new)
    found: dict[float, str] = {}
    for qps in sorted(new):
        above = [point for q, point in points.items() if q > qps and q not in new and not point.feasible]
        if not above:
            continue
        nearest = min(above, key=lambda point: point.qps)
        if same_failure(points[qps], nearest):
            values = ", ".join(f"{key} {value:.4g} ms" if value is not None else f"{key} unbounded (unfinished "
                               "requests)" for key, value in points[qps].slo_values_ms.items())
            found[qps] = f"from {nearest.qps:.4g} down to {qps:.4g} req/s the SLO statistics stayed at {values}"
    return found


def same_failure(lower: PointResult, higher: PointResult) -> bool:
    """Both missed an SLO while keeping up (stable, simulated in full), with every SLO statistic and every
    statistic (p50, p90, p99, mean) of each SLO's metric unchanged to the 6 significant digits they are kept at.
    The mean moves with any request that waited, so equal means say no request did at either load."""
    if any(p.meets_slos or not p.stable or p.stopped_early for p in (lower, higher)):
        return False
    if lower.slo_values_ms != higher.slo_values_ms:
        return False
    metrics = {f"{key.partition('_')[0]}_ms" for key in lower.slo_values_ms}
    return all(lower.latency_ms.get(m) is not None and lower.latency_ms.get(m) == higher.latency_ms.get(m)
               for m in metrics)


# ---- the driver ----------------------------------------------------------------------------------
def run_sweep(
    configs: Sequence[SimConfig],
    params: SearchParams,
    executor: Executor,
    labels: Sequence[str] | None = None,
    progress_bar=None,
    seeds: Sequence[int] = (0,),
    check_duration: bool = True,
    band_replays: bool = False,
    run_ahead_counts: dict | None = None,
) -> list[ConfigResult]:
    """Search every configuration's max QPS on every seed; searches proceed concurrently on `executor`.

    `progress_bar` (e.g. tqdm) counts simulations; its total starts at the worst case and shrinks as
    searches converge. `check_duration`: simulate each answer again on a stream twice as long; an answer
    that fails there counts as failed and its search goes on below it (at most MAX_DURATION_CHECKS checks).
    `band_replays`: seed s's search is also band replay s (`sim.bands`), its deployment perturbed as
    `sim.replay --bands` perturbs it. An executor with ``num_workers`` (a local pool) runs jobs ahead of their
    search's verdicts on workers that would idle (`analysis.capacity.speculation`; the same answers):
    ``run_ahead_counts``, when given, gets how many were (``run_ahead``) and how many of them a search took (``used``).
    """
    labels = list(labels) if labels is not None else [config_label(c, varying_axes(configs)) for c in configs]
    # Configurations that simulate alike are searched once, as the first of them (results are per configuration).
    first_with: dict[SimConfig, int] = {}
    searched_as = [first_with.setdefault(search_identity(config), index) for index, config in enumerate(configs)]
    keys = [(index, seed) for index in range(len(configs)) if searched_as[index] == index for seed in seeds]
    searches = {key: CapacitySearch(params) for key in keys}
    points: dict[tuple[int, int], dict[float, PointResult]] = {key: {} for key in keys}
    checks: dict[tuple[int, int], list[PointResult]] = {key: [] for key in keys}
    waiting: dict[tuple[int, int], set[float]] = {key: set() for key in keys}
    in_flight: dict[Future, tuple[tuple[int, int], PointJob]] = {}
    worst_case = params.max_iterations + (MAX_DURATION_CHECKS if check_duration else 0)
    checking: set[tuple[int, int]] = set()  # searches whose answer is being simulated twice as long
    rounds: dict[tuple[int, int], list[PointJob]] = {key: [] for key in keys}  # each search's jobs in flight
    # Simulations run ahead of their search's verdicts on otherwise idle workers (analysis.capacity.speculation),
    # by (search, job identity); those no verdict can lead to any more that were running already, until they end.
    num_workers = getattr(executor, "num_workers", 0)
    ahead: dict[tuple, Future] = {}
    abandoned: list[Future] = []
    ahead_counts = run_ahead_counts if run_ahead_counts is not None else {}
    ahead_counts.update(run_ahead=0, used=0)

    def update_total() -> None:
        """The most simulations still possible: exact for finished searches, the worst case for the others."""
        if progress_bar is None:
            return
        progress_bar.total = sum(
            searches[key].num_evaluated + len(checks[key]) + (key in checking) if searches[key].done else worst_case
            for key in keys
        )
        progress_bar.refresh()

    def next_round(key: tuple[int, int], search: CapacitySearch) -> list[PointJob]:
        """The jobs to submit for ``search`` (key's, or a copy of it run ahead) now that its verdicts are back: its
        next round's points, or the check of its answer on a stream twice as long once it is done."""
        # The early-stop probe only while no load has passed: until then a QPS may lie any multiple above capacity
        # (the search halves down from it), and a probe that stops saves two thirds of the costliest runs. Once a
        # load passed, every QPS tried is at most twice one that passed and mostly near capacity, where the probe
        # seldom stops and is simulated again as the whole stream's first third: on the default sweep of
        # traces/sharegpt.parquet 1 probe of 9 stopped, and probing only before the first pass simulates 81,361
        # requests instead of 97,413 for the same answer (benchmarks/capacity_speed.py).
        # After a pass, a run stops instead once it has certainly missed an SLO (analysis.capacity.certain_miss): the
        # loads tried then lie between one that passed and one that failed, just past capacity or well past it, and a
        # miss is certain after a third to three quarters of the stream (the default sweep: 81,361 -> 65,794 requests
        # simulated, the same points failing). Not before: a search that never passes recognises an SLO no load can
        # meet by two loads failing alike, which needs their whole runs (load_independent_failures).
        probe = search.highest_pass is None
        config, seed = configs[key[0]], key[1]
        jobs = [PointJob(config, qps, seed, band_replay=band_replays, probe=probe, certain_miss=not probe)
                for qps in search.propose()]
        if search.done:
            answer = search.outcome().max_qps
            if check_duration and answer is not None:  # a QPS that passed: no probe
                jobs.append(PointJob(config, answer, seed, duration_scale=2.0, band_replay=band_replays,
                                     probe=False, certain_miss=True))
        return jobs

    def launch(key: tuple[int, int]) -> None:
        search = searches[key]
        rounds[key] = next_round(key, search)
        for job in rounds[key]:
            future = ahead.pop((key, job_identity(job)), None)  # simulated ahead: the same job, its result to come
            if future is None:
                future = executor.submit(job)
            else:
                ahead_counts["used"] += 1
            in_flight[future] = (key, job)
            if job.duration_scale == 1.0:
                waiting[key].add(job.qps)
            else:
                checking.add(key)
        if search.done:
            update_total()

    def ahead_of(key: tuple[int, int]) -> list[PointJob]:
        return jobs_ahead(searches[key], rounds[key], len(checks[key]), lambda search: next_round(key, search),
                          MAX_DURATION_CHECKS)

    def drop_unreachable(key: tuple[int, int]) -> None:
        """After ``key``'s verdicts: drop its jobs run ahead that they no longer lead to (the other searches' are
        still reachable: their state did not change)."""
        mine = [identity for identity in ahead if identity[0] == key]
        if not mine:
            return
        reachable = {(key, job_identity(job)) for job in ahead_of(key)} if rounds[key] else set()
        for identity in mine:
            if identity not in reachable:
                future = ahead.pop(identity)
                if executor.drop(future):  # never started: not counted as run
                    ahead_counts["run_ahead"] -= 1
                else:  # running: its worker stays busy until it stops (a local pool's stops it within requests)
                    abandoned.append(future)

    def fill_idle_workers() -> None:
        """Run ahead, on workers nothing else occupies, the jobs the searches may submit next
        (analysis.capacity.speculation), searches in order; a search's jobs are looked for only while a worker is
        free (a sweep of many configurations keeps every worker busy with jobs it needs)."""
        abandoned[:] = [future for future in abandoned if not future.done()]
        busy = sum(not f.done() for f in in_flight) + sum(not f.done() for f in ahead.values()) + len(abandoned)
        for key in keys:
            if busy >= num_workers:
                return
            if not rounds[key]:
                continue
            for job in ahead_of(key):
                identity = (key, job_identity(job))
                if identity not in ahead:
                    ahead[identity] = executor.submit(job)
                    ahead_counts["run_ahead"] += 1
                    busy += 1
                    if busy >= num_workers:
                        return

    update_total()
    try:
        for key in keys:
            launch(key)
        if num_workers:
            fill_idle_workers()
        while in_flight:
            # Ctrl-C is held while `wait` runs (it takes every future's lock in turn; see analysis.process_pools)
            # and acted on when it returns: within the 0.2 s it waits at most, not when the next simulation finishes.
            with interrupts_held():
                finished, _ = wait(list(in_flight), timeout=0.2, return_when=FIRST_COMPLETED)
            for future in finished:
                key, job = in_flight.pop(future)
                if progress_bar is not None:
                    progress_bar.update(1)
                if job.duration_scale != 1.0:
                    check = future.result()
                    checks[key].append(check)
                    checking.discard(key)
                    rounds[key] = []
                    if not check.feasible and len(checks[key]) < MAX_DURATION_CHECKS:
                        searches[key].revise(job.qps)
                        launch(key)
                    drop_unreachable(key)
                    update_total()
                    continue
                points[key][job.qps] = future.result()
                waiting[key].discard(job.qps)
                if not waiting[key]:  # the search's whole round is back
                    search = searches[key]
                    search.observe({q: points[key][q].feasible for q in search.pending},
                                   load_independent=load_independent_failures(points[key], search.pending))
                    launch(key)
                    drop_unreachable(key)
            # A worker freed (a job back, or a dropped one stopped): fill it; between those nothing changed.
            if num_workers and (finished or any(future.done() for future in abandoned)):
                fill_idle_workers()
    except BaseException:  # Ctrl-C or a failed simulation: stop everything still running, now
        executor.close(interrupted=True)
        raise
    # Jobs run ahead that no search took: stopped rather than waited for (a whole simulation, for nothing).
    for future in ahead.values():
        if executor.drop(future):
            ahead_counts["run_ahead"] -= 1
        else:
            abandoned.append(future)
    executor.close(interrupted=any(not future.done() for future in abandoned))
    results = []
    for index, config in enumerate(configs):
        per_seed = []
        searched = searched_as[index]
        for seed in seeds:
            outcome = searches[(searched, seed)].outcome()
            tried = tuple(points[(searched, seed)][qps] for qps, _ in outcome.points)
            per_seed.append(SeedSearch(seed, outcome, tried, tuple(checks[(searched, seed)])))
        results.append(ConfigResult(index, config, labels[index], tuple(per_seed), band_replays=band_replays,
                                    same_search_as=None if searched == index else searched))
    extra = superlinear_notes(results, params.tolerance)
    return [dataclasses.replace(r, notes=(extra[r.index],)) if r.index in extra else r for r in results]
