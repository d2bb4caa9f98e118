"""A capacity sweep from its command-line options: validated before any simulation (so bad input
costs nothing and exits with code 2 naming the option), then run and costed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from analysis.capacity.bisection import START_SIGNIFICANT_DIGITS, SearchParams
from analysis.capacity.cost import DEFAULT_GPU_COST_PER_HOUR_USD, ConfigEconomics, assess, load_gpu_costs
from analysis.capacity.executors import default_num_jobs, make_executor
from analysis.capacity.speculation import workers_per_search
from analysis.capacity.sweep import (
    SWEEP_AXES,
    ConfigResult,
    SweepError,
    config_label,
    expand_configs,
    family_label,
    run_sweep,
    search_identity,
    shortened_notes,
    varying_axes,
)
from analysis.capacity.workload import (
    DEFAULT_MAX_REQUESTS,
    MAX_STREAM_REQUESTS,
    SessionLibrary,
    WorkloadParams,
    max_stream_qps,
)
from analysis.progress import progress_bar
from analysis.slo import SLO, statistic_of
from analysis.stats import round_sig
from engine.core.config_args import build_config
from engine.core.host_memory import host_memory_available
from sim.config import SimConfig, unused_router_note
from sim.limits import sampling_note
from sim.simulator import cost_model_description, make_cost_model
from traces.requests import check_host_memory


@dataclasses.dataclass(frozen=True)
class CapacityRun:
    """Everything a run produced, for the writers and the printed table."""

    trace_path: str
    num_requests: int
    trace_qps: float
    slos: tuple[SLO, ...]
    results: list[ConfigResult]
    economics: list[ConfigEconomics]
    family_labels: list[str]
    target_qps: float
    gpu_costs: dict[str, float]
    cost_models: list[str]  # per configuration: "auto" may pick a measured profile for some only
    wall_s: float
    num_jobs: int
    workload: WorkloadParams
    seeds: tuple[int, ...]
    num_sessions: int
    band_replays: bool = False
    num_run_ahead: int = 0  # simulations run ahead of their search's verdicts on idle workers
    num_run_ahead_used: int = 0  # ... of which a search took the result

    @property
    def cost_model_text(self) -> str:
        return ", ".join(sorted(set(self.cost_models)))


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    parser.exit(2, f"error: {message}\n")


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A validated sweep, ready to simulate: built before any simulation so bad input costs nothing."""

    trace: object  # traces.schema.Trace, after --limit
    library: SessionLibrary
    workload: WorkloadParams
    seeds: tuple[int, ...]
    band_replays: bool
    trace_qps: float
    configs: list[SimConfig]
    labels: list[str]
    family_labels: list[str]
    cost_models: list[str]
    params: SearchParams
    gpu_costs: dict[str, float]
    config_notes: list[tuple[str, ...]]  # per configuration: notes that hold whatever its searches find


# The steady streams draw the trace's requests at random: one may hold this much less of the rejected share than
# the trace does. A share that fails an SLO even so fails it at every QPS.
REJECTED_SHARE_MARGIN = 0.1


@dataclasses.dataclass(frozen=True)
class Rejections:
    """What the scheduler does with the trace's prompts under one configuration: `refusal` says why no QPS can
    meet the SLOs (the sweep is refused), `note` why every answer must be read with care (None: neither)."""

    refusal: str | None = None
    note: str | None = None


def _rejections(config: SimConfig, shape, requests, slos) -> Rejections:
    """The trace's prompts (``requests``: its prompt and output token counts) the scheduler rejects as never fitting.
    A rejected request counts as infinitely slow (slo_check): too many of them fail the SLOs at every QPS, so the
    sweep would simulate every load, fail each, and advise raising --max-iterations, which changes nothing (a
    refusal). Fewer still decide loads: each stream draws its own share of them, and a QPS whose window happened to
    draw a few more failed while the replica was idle (5 of 100 prompts too long for the model, --slo ttft_p90: 3.75
    req/s printed as the capacity, the 4 req/s above it failed by 2 rejections in 15 requests, at 2 ms TTFT); a note
    says so."""
    from engine.core.scheduler import Scheduler

    scheduler = Scheduler(config.resolved_for(shape))
    lengths, inverse = np.unique(requests["prompt_tokens"].to_numpy(), return_inverse=True)
    reasons = [scheduler.rejection_reason_for(int(n)) for n in lengths]
    never_fits = np.array([reason is not None for reason in reasons])[inverse]
    rejected, total = int(never_fits.sum()), len(never_fits)
    if not rejected:
        return Rejections()
    share = rejected / total
    first = next(reason for reason in reasons if reason)  # the shortest rejected prompt's
    if rejected == total:
        return Rejections(refusal=f"no request of the trace can ever fit (the shortest: {first}), so no QPS can "
                                  "meet the SLOs")
    # ITL pools every gap between tokens, one infinite gap per unfinished request among them (slo_check): a rejected
    # request is one sample beside the output_tokens - 1 of each served one, not one request in the trace's. Taken
    # as the requests' share, 16 % of sharegpt's first 300 prompts beyond --max-model-len 2500 refused itl_p99=50ms as
    # failing at every QPS, where the loads up to 62 req/s meet it with an ITL p99 of 2-14 ms. TPOT has no sample of
    # a served one-token output, so its share is above the requests': taken as theirs, tpot_p50 on a trace of 30 %
    # rejected and 60 % one-token requests (3 of TPOT's 4 samples infinite) was simulated, failed every load, and
    # blamed the SLO as tighter than a request served alone. (A cut output has fewer samples: its share is only
    # higher than these.)
    served_outputs = requests["output_tokens"].to_numpy()[~never_fits]
    gaps = int(np.maximum(served_outputs - 1, 0).sum())
    shares = {"itl": rejected / (rejected + gaps), "tpot": rejected / (rejected + int((served_outputs > 1).sum()))}
    failed = [slo for slo in slos
              if statistic_of(_with_rejected(shares.get(slo.metric, share)), slo.statistic) == np.inf]
    if failed:
        return Rejections(refusal=f"{rejected} of {total} requests of the trace can never fit (the shortest of "
                                  f"them: {first}), and a rejected request counts as infinitely slow, so "
                                  f"{failed[0]} fails at every QPS")
    return Rejections(note=f"{rejected} of {total} requests of the trace ({share:.1%}) can never fit (the shortest "
                           f"of them: {first}); each stream rejects its own draw of them and a rejected request "
                           "counts as infinitely slow, so a QPS can fail by the rejections its window drew rather "
                           "than by load (see num_rejected of the points)")


def _with_rejected(share: float) -> np.ndarray:
    """A thousand samples, the fewest share of rejected ones a stream may draw (REJECTED_SHARE_MARGIN) infinite."""
    fitting = round(1000 * min(1.0, 1 - share + REJECTED_SHARE_MARGIN))
    return np.concatenate([np.zeros(fitting), np.full(1000 - fitting, np.inf)])


# Metrics measured between output tokens: a request of one output token has no sample of them.
_BETWEEN_TOKENS = ("tpot", "itl")


def _without_samples(slos, max_output_tokens: int) -> str | None:
    """Why an SLO can judge nothing on this trace, or None. A statistic without samples is met (slo_check), so a
    TPOT or ITL limit on a trace of one-token outputs passed at every load and its column read '-' with no word."""
    if max_output_tokens > 1:
        return None
    for slo in slos:
        if slo.metric in _BETWEEN_TOKENS:
            return (f"{slo} judges nothing: every request of the trace asks for one output token, so "
                    f"{slo.label.split()[0]} has no samples and the SLO would be met at every load; drop it or "
                    "limit ttft, e2e or queue")
    return None


def plan_sweep(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SweepPlan:
    """Validate everything that can be checked before simulating; exit 2 with a named option otherwise."""
    from traces.schema import TraceError, load_trace

    try:
        trace = load_trace(args.trace)
    except TraceError as exc:
        _fail(parser, f"TRACE: {exc}")
    if args.limit is not None:
        if args.limit < 2:
            _fail(parser, f"--limit must be >= 2 (a rate needs two arrivals), got {args.limit}")
        trace = trace.head(args.limit)
    arrivals = trace.requests["arrival_s"]
    span_s = float(arrivals[-1] - arrivals[0]) if len(trace) > 1 else 0.0
    if span_s <= 0:
        _fail(parser, f"TRACE: {args.trace}: every request arrives at once, so it has no rate to rescale")
    trace_qps = (len(trace) - 1) / span_s
    vacuous = _without_samples(args.slo, int(trace.requests["output_tokens"].max()))
    if vacuous:
        _fail(parser, f"--slo: {vacuous}")
    library = SessionLibrary.from_trace(trace)
    if args.think_times == "scale" and library.num_sessions == len(trace):
        # Every request its own session: no gap between turns to scale, and the sweep ran as with "keep", at exit
        # 0, its report saying "think times: scale".
        _fail(parser, f"--think-times scale: {args.trace} has no session of more than one request (a session_id "
                      "column groups a conversation's turns), so there are no think times to scale; leave it out")
    try:
        # --max-requests left out: the default, raised to --min-requests (a user who asked for more gets them).
        max_requests = (args.max_requests if args.max_requests is not None
                        else max(DEFAULT_MAX_REQUESTS, args.min_requests))
        workload = WorkloadParams(min_duration_s=args.min_duration_s, min_requests=args.min_requests,
                                  warmup_fraction=args.warmup_fraction, think_times=args.think_times,
                                  stability_tolerance=args.stability_tolerance, early_stop=not args.no_early_stop,
                                  max_requests=max_requests)
    except ValueError as exc:
        _fail(parser, str(exc))
    if workload.min_duration_s <= 0 and workload.min_requests <= 0:
        _fail(parser, "--min-duration-s and --min-requests are both 0: a stream needs a length; set one above 0")
    num_searches = args.seeds
    if args.bands is not None:
        from sim.bands import check_num_replays

        if args.seeds != 1:
            _fail(parser, f"--bands {args.bands} and --seeds {args.seeds}: --bands N already runs N seeded searches "
                          "(one per band replay); give one of them")
        try:
            num_searches = check_num_replays(args.bands)
        except ValueError as exc:
            _fail(parser, str(exc))
    seeds = tuple(range(args.seed_offset, args.seed_offset + num_searches))

    # A swept option is a tuple of values; left at its default it is the config's single default.
    axes = {field: v if isinstance(v, tuple) else (v,) for field in SWEEP_AXES for v in [getattr(args, field)]}
    if len(axes["router"]) > 1 and max(axes["num_replicas"]) == 1:
        # A router chooses between replicas: with one, --router rr,lor searched the same configuration twice and
        # reported two "configurations" (and two replica answers) that are one.
        _fail(parser, f"--router {','.join(axes['router'])}: a router chooses between replicas, and every "
                      "configuration has --replicas 1, so each router would simulate the same configuration; give "
                      "one router, or --replicas with a count above 1")
    # The first value of each swept list makes the base config; expand_configs replaces them per configuration.
    scalar = argparse.Namespace(**{**vars(args), **{field: values[0] for field, values in axes.items()}})
    try:
        base = build_config(SimConfig, scalar)
        configs = expand_configs(base, axes)
    except (ValueError, SweepError) as exc:
        _fail(parser, str(exc))
    router_note = unused_router_note(axes["router"][0], max(axes["num_replicas"]))
    if router_note:  # (two routers over one replica were refused above)
        print(router_note, file=sys.stderr)
    varying = varying_axes(configs)
    labels = [config_label(c, varying) for c in configs]
    cost_models = []
    config_notes: list[tuple[str, ...]] = []  # per configuration, what every answer of it must be read with
    for config, label in zip(configs, labels):
        try:
            shape = config.model_shape
            trace.check_vocabulary(shape.vocab_size)  # a stored prompt id beyond the model's failed mid-sweep
            # Before any simulation: a worker's RequestMemoryError was a traceback mid-sweep.
            check_host_memory(trace, config.resolved_for(shape), host_memory_available())
            rejections = _rejections(config, shape, trace.requests, args.slo)
            if rejections.refusal:
                _fail(parser, f"configuration {label!r}: {rejections.refusal}; expected a configuration that serves "
                              "the trace's prompts")
            # The profile is read and checked here first (a malformed one is refused, naming it), then its sampling.
            cost_models.append(cost_model_description(make_cost_model(config, shape), config.host_slowdown))
            # A sampled sweep priced as greedy (the profile measured no sampling) says so in every answer's notes.
            config_notes.append(tuple(note for note in (rejections.note, sampling_note(config, shape)) if note))
        except (ValueError, FileNotFoundError) as exc:
            _fail(parser, f"configuration {label!r}: {exc}")
    scale = 1.0 if args.no_duration_check else 2.0  # the answer is simulated again twice as long
    try:
        params = SearchParams(start_qps=round_sig(trace_qps, START_SIGNIFICANT_DIGITS), qps_min=args.qps_min,
                              qps_max=args.qps_max, tolerance=args.tolerance, max_iterations=args.max_iterations,
                              candidates_per_round=args.candidates_per_round, qps_floor=workload.min_qps(scale),
                              qps_ceiling=max_stream_qps(library, workload, scale))
        # The bracket's ends as given (or the start, the trace's own rate): a stream there must be simulable.
        for qps in {params.qps_max or params.start_qps, params.qps_min or params.start_qps}:
            workload.check_stream_size(qps, scale)
            if qps > params.qps_ceiling:  # the sessions started before the stream count too (steady_trace)
                raise ValueError(f"a stream at {qps:.6g} requests/s would draw more requests than one simulation "
                                 f"takes ({MAX_STREAM_REQUESTS:,}, with the sessions started before it); the most "
                                 f"is {params.qps_ceiling:.4g} requests/s: lower the QPS bracket (--qps-max) or "
                                 "--min-duration-s")
    except ValueError as exc:
        _fail(parser, str(exc))
    try:
        given_costs = load_gpu_costs(args.gpu_cost, defaults={})  # the prices the option gives, {} without it
    except (ValueError, OSError) as exc:  # a price given inline names the option already
        _fail(parser, str(exc) if str(exc).startswith("--gpu-cost") else f"--gpu-cost: {exc}")
    swept_gpus = sorted({c.gpu for c in configs})
    if given_costs and not set(given_costs) & set(swept_gpus):
        # --gpu-cost h100=3 on a sweep of h200 priced it at the illustrative list price, at exit 0: the option did
        # nothing, and the $/1M tokens read as the price given.
        _fail(parser, f"--gpu-cost prices {', '.join(sorted(given_costs))}, and the sweep runs on "
                      f"{', '.join(swept_gpus)} (--gpu): none of its GPUs would get the price given; price "
                      f"{' and '.join(swept_gpus)}")
    gpu_costs = {**DEFAULT_GPU_COST_PER_HOUR_USD, **given_costs}
    missing = sorted(gpu for gpu in swept_gpus if gpu not in gpu_costs)
    if missing:
        _fail(parser, f"--gpu-cost: no price for {', '.join(missing)}")
    families = [family_label(c, varying) for c in configs]
    return SweepPlan(trace, library, workload, seeds, args.bands is not None, trace_qps, configs, labels, families,
                     cost_models, params, gpu_costs, config_notes)


def run_capacity(args: argparse.Namespace, parser: argparse.ArgumentParser) -> CapacityRun:
    """Plan, then run the sweep with a progress bar (unless --quiet), then cost it."""
    plan = plan_sweep(parser, args)
    slos: tuple[SLO, ...] = args.slo
    # More processes than simulations that can run at once would only pay start-up time: a search's round, and the
    # jobs a plain bisection may run ahead of its verdicts (analysis.capacity.speculation).
    num_searched = len({search_identity(config) for config in plan.configs})  # configurations searched as one, once
    num_jobs = max(1, min(args.jobs or default_num_jobs(),
                          num_searched * len(plan.seeds) * workers_per_search(plan.params.candidates_per_round)))
    try:
        executor = make_executor(plan.library, plan.workload, slos, num_jobs, args.ray, plan.configs,
                                 args.ray_connect_timeout_s)
    except SweepError as exc:
        _fail(parser, str(exc))
    run_ahead: dict = {}
    with progress_bar(args.quiet, unit="sim", desc=f"sweeping {len(plan.configs)} configuration(s)",
                      mininterval=0.5) as bar:
        started = time.perf_counter()
        results = run_sweep(plan.configs, plan.params, executor, plan.labels, bar, seeds=plan.seeds,
                            check_duration=not args.no_duration_check, band_replays=plan.band_replays,
                            run_ahead_counts=run_ahead)
    wall_s = time.perf_counter() - started
    results = [dataclasses.replace(r, notes=plan.config_notes[r.index] + r.notes + shortened_notes(r, plan.workload))
               for r in results]
    target_qps = args.target_qps if args.target_qps is not None else plan.params.start_qps
    return CapacityRun(
        trace_path=str(args.trace), num_requests=len(plan.trace), trace_qps=plan.trace_qps, slos=slos,
        results=results, economics=assess(results, plan.gpu_costs, target_qps, slos[0].key),
        family_labels=plan.family_labels, target_qps=target_qps, gpu_costs=plan.gpu_costs,
        cost_models=plan.cost_models, wall_s=wall_s, num_jobs=num_jobs, workload=plan.workload, seeds=plan.seeds,
        num_sessions=plan.library.num_sessions, band_replays=plan.band_replays,
        num_run_ahead=run_ahead.get("run_ahead", 0), num_run_ahead_used=run_ahead.get("used", 0),
    )
