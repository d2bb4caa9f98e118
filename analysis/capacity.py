"""Capacity planning by simulation: ``python -m analysis.capacity TRACE --slo ttft_p90=2s,tpot_p90=100ms``.

For every configuration in the cross product of the comma-separated options (models, GPUs, replica
counts, policies, ...), bisect on the offered load (the trace's arrivals rescaled to a QPS) for the
highest QPS that meets every SLO, recording the goodput at each QPS tried. Writes to --out:

- ``capacity.json``: a list, one object per configuration: ``config_id``, ``label``, ``options``
  (every simulator option), ``max_qps`` (null when no QPS tried met the SLOs), ``converged``,
  ``monotone``, ``notes``, ``num_simulations``, ``slos_ms``, ``cost``, ``pareto``,
  ``replicas_needed`` and ``points`` (each QPS tried, in order: ``qps``, ``meets_slos``,
  ``goodput_rps``, ``slo_values_ms``, throughputs and latency percentiles).
- ``capacity.parquet``: one row per (configuration, QPS tried), the same figures flattened.
- ``report.html``: the charts (one offline file).

Module map: `analysis.slo` (SLO syntax and checks), `analysis.bisection` (the search),
`analysis.sweep` (cross product, parallel execution), `analysis.capacity_cost` (cost, Pareto,
replicas needed), `analysis.capacity_report` (the page). See analysis/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis.bisection import SearchParams, round_sig_qps
from analysis.capacity_cost import DEFAULT_GPU_COST_PER_HOUR_USD, ConfigEconomics, assess, load_gpu_costs
from analysis.slo import SLO, parse_slos
from analysis.stats import round_sig
from analysis.summary_table import format_number
from analysis.sweep import (
    SWEEP_AXES,
    ConfigResult,
    SweepError,
    config_label,
    default_num_jobs,
    expand_configs,
    family_label,
    make_executor,
    run_sweep,
    varying_axes,
)
from engine.core.config import SCHEDULING_POLICIES
from sim.simulator import SimConfig, make_cost_model
from sim.hardware import get_gpu
from engine.replay_args import add_engine_arguments
from sim.replay import build_parser as build_replay_parser
from sim.replay import config_from_args, default_out_dir
from sim.router import ROUTERS

__all__ = ["CapacityRun", "SweepPlan", "build_parser", "main", "plan_sweep", "run_capacity", "write_outputs"]


# ---- option parsing ------------------------------------------------------------------------------
def comma_list(parse_item: Callable[[str], object]) -> Callable[[str], tuple]:
    """An argparse type for ``a,b,c``; argparse prefixes its errors with the option's name."""

    def parse(text: str) -> tuple:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or any(not item for item in items):
            raise argparse.ArgumentTypeError(f"empty list or empty item in {text!r}; expected e.g. a,b,c")
        values = tuple(parse_item(item) for item in items)
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise argparse.ArgumentTypeError(f"{', '.join(duplicates)} given twice in {text!r}")
        return values

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


def model_name(text: str) -> str:
    from engine.core.model_config import ModelShape

    try:
        ModelShape.load(text)
    except (FileNotFoundError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def gpu_name(text: str) -> str:
    try:
        return get_gpu(text).name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def choice_of(names: Sequence[str], what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; supported: {', '.join(names)}")
        return text

    return parse


def slo_list(text: str) -> tuple[SLO, ...]:
    try:
        return parse_slos(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.capacity",
        description=(
            "Find, by simulation, the highest QPS each configuration serves within latency SLOs. Comma lists in "
            "--model, --gpu, --replicas, --tensor-parallel-size, --policy, --max-num-seqs and --router form a "
            "cross product; each configuration is bisected on QPS (the trace's arrivals rescaled)."
        ),
        epilog="example: python -m analysis.capacity traces/sharegpt.parquet --slo ttft_p90=2s,tpot_p90=100ms "
        "--replicas 1,2 --policy mixed,nano --target-qps 100",
        # The sweep re-declares some engine options as comma lists; "resolve" lets them replace the single-valued ones.
        conflict_handler="resolve",
    )
    parser.add_argument("trace", help="trace parquet (see traces/README.md)")
    parser.add_argument("--limit", type=positive_int, default=None, help="use only the first N requests (N >= 2)")
    parser.add_argument(
        "--slo",
        required=True,
        type=slo_list,
        help="comma list of metric_statistic=value+unit; metrics: ttft, tpot, itl, e2e, queue; statistics: "
        "p50, p90, p95, p99, mean; units: ms, s (e.g. ttft_p90=2s,tpot_p90=100ms). Unfinished requests count "
        "as infinitely slow. The first SLO is the latency axis of the Pareto chart",
    )
    add_engine_arguments(parser)
    sweep = parser.add_argument_group("sweep (comma lists; their cross product is swept)")
    sweep.add_argument("--model", type=comma_list(model_name), default=("qwen3-0.6b",),
                       help="shipped model config names or HF model dirs (default: qwen3-0.6b)")
    sweep.add_argument("--gpu", type=comma_list(gpu_name), default=("h200",), help="GPU types (default: h200)")
    sweep.add_argument("--replicas", type=comma_list(positive_int), default=(1,), help="replica counts (default: 1)")
    sweep.add_argument("--tensor-parallel-size", type=comma_list(positive_int), default=(1,),
                       help="GPUs per replica (default: 1)")
    sweep.add_argument("--policy", type=comma_list(choice_of(SCHEDULING_POLICIES, "policy")), default=("mixed",),
                       help=f"scheduling policies: {', '.join(SCHEDULING_POLICIES)} (default: mixed)")
    sweep.add_argument("--max-num-seqs", type=comma_list(positive_int), default=(256,),
                       help="most sequences in one step (default: 256)")
    sweep.add_argument("--router", type=comma_list(choice_of(list(ROUTERS), "router")), default=("rr",),
                       help=f"request routers: {', '.join(ROUTERS)} (default: rr)")
    simulator = parser.add_argument_group("simulator")
    simulator.add_argument(
        "--cost-model", default="auto",
        help="auto (a measured profile from sim/profiles/ when one matches the model, GPU and TP, else the roofline "
        "estimate), roofline, or a profile JSON path (default: %(default)s)",
    )
    search = parser.add_argument_group("search")
    search.add_argument("--qps-min", type=positive_float, default=None,
                        help="lower end of the QPS bracket (default: found automatically)")
    search.add_argument("--qps-max", type=positive_float, default=None,
                        help="upper end of the QPS bracket (default: found automatically, starting at the trace's "
                        "own rate and doubling or halving)")
    search.add_argument("--tolerance", type=float, default=0.05,
                        help="stop when (fail - pass) / pass <= this (default: %(default)s)")
    search.add_argument("--max-iterations", type=positive_int, default=20,
                        help="most simulations per configuration (default: %(default)s)")
    search.add_argument("--candidates-per-round", type=positive_int, default=1,
                        help="QPS values of one configuration simulated at once (k-section search; uses more "
                        "cores per configuration, and can reveal non-monotone latency) (default: %(default)s)")
    cost = parser.add_argument_group("capacity planning")
    cost.add_argument("--target-qps", type=positive_float, default=None,
                      help="load to size replicas for (default: the trace's own mean rate)")
    defaults = ",".join(f"{gpu}={price:g}" for gpu, price in DEFAULT_GPU_COST_PER_HOUR_USD.items())
    cost.add_argument("--gpu-cost", default=None,
                      help=f"USD per GPU-hour as gpu=price pairs or a file (JSON object or gpu=price lines); "
                      f"overrides the illustrative list prices {defaults}")
    run = parser.add_argument_group("execution")
    run.add_argument("--jobs", type=positive_int, default=None,
                     help="local processes (default: the cores available); results do not depend on it")
    run.add_argument("--ray", default=None, metavar="ADDRESS",
                     help="run the simulations on this Ray cluster (e.g. auto or ray://host:10001)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", default=None, help="output folder (default: a new folder under runs/)")
    out.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    return parser


# ---- the sweep -----------------------------------------------------------------------------------
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

    @property
    def cost_model_text(self) -> str:
        return ", ".join(sorted(set(self.cost_models)))


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    parser.exit(2, f"error: {message}\n")


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """A validated sweep, ready to simulate: built before any simulation so bad input costs nothing."""

    trace: object  # traces.schema.Trace, after --limit
    trace_qps: float
    configs: list[SimConfig]
    labels: list[str]
    family_labels: list[str]
    cost_models: list[str]
    params: SearchParams
    gpu_costs: dict[str, float]


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

    axes = {field: getattr(args, _attr(option)) for field, option in SWEEP_AXES.items()}
    # sim.replay's own defaults first, so its config_from_args finds every option it reads,
    # then this sweep's options, then the first value of each swept list (replaced per configuration).
    scalar = build_replay_parser().parse_args([args.trace])
    for key, value in vars(args).items():
        setattr(scalar, key, value)
    for field, option in SWEEP_AXES.items():
        setattr(scalar, _attr(option), axes[field][0])
    try:
        base = config_from_args(scalar)
        configs = expand_configs(base, axes)
    except (ValueError, SweepError) as exc:
        _fail(parser, str(exc))
    varying = varying_axes(configs)
    labels = [config_label(c, varying) for c in configs]
    cost_models = []
    for config, label in zip(configs, labels):
        try:
            shape = config.model_shape
            config.scheduler_config(shape)
            cost_models.append(make_cost_model(config, shape).name)
        except (ValueError, FileNotFoundError) as exc:
            _fail(parser, f"configuration {label!r}: {exc}")
    try:
        params = SearchParams(
            start_qps=round_sig_qps(trace_qps),
            qps_min=args.qps_min,
            qps_max=args.qps_max,
            tolerance=args.tolerance,
            max_iterations=args.max_iterations,
            candidates_per_round=args.candidates_per_round,
        )
    except ValueError as exc:
        _fail(parser, str(exc))
    try:
        gpu_costs = load_gpu_costs(args.gpu_cost)
    except (ValueError, OSError) as exc:
        _fail(parser, f"--gpu-cost: {exc}")
    missing = sorted({c.gpu for c in configs if c.gpu not in gpu_costs})
    if missing:
        _fail(parser, f"--gpu-cost: no price for {', '.join(missing)}")
    families = [family_label(c, varying) for c in configs]
    return SweepPlan(trace, trace_qps, configs, labels, families, cost_models, params, gpu_costs)


def _attr(option: str) -> str:
    """The argparse attribute of ``--tensor-parallel-size``: ``tensor_parallel_size``."""
    return option.lstrip("-").replace("-", "_")


def run_capacity(args: argparse.Namespace, parser: argparse.ArgumentParser) -> CapacityRun:
    """Plan, then run the sweep with a progress bar (unless --quiet), then cost it."""
    plan = plan_sweep(parser, args)
    slos: tuple[SLO, ...] = args.slo
    requested_jobs = args.jobs or default_num_jobs()
    # More processes than simulations that can run at once would only pay start-up time.
    num_jobs = max(1, min(requested_jobs, len(plan.configs) * plan.params.candidates_per_round))
    try:
        executor = make_executor(plan.trace, slos, num_jobs, args.ray)
    except SweepError as exc:
        _fail(parser, str(exc))
    bar = None
    if not args.quiet:
        from tqdm import tqdm

        bar = tqdm(unit="sim", desc=f"sweeping {len(plan.configs)} configuration(s)", file=sys.stderr,
                   mininterval=0.5)
    started = time.perf_counter()
    try:
        results = run_sweep(plan.configs, plan.params, executor, plan.labels, bar)
    finally:
        if bar is not None:
            bar.close()
    wall_s = time.perf_counter() - started
    target_qps = args.target_qps if args.target_qps is not None else round_sig_qps(plan.trace_qps)
    economics = assess(results, plan.gpu_costs, target_qps, slos[0].key)
    return CapacityRun(
        trace_path=str(args.trace),
        num_requests=len(plan.trace),
        trace_qps=plan.trace_qps,
        slos=slos,
        results=results,
        economics=economics,
        family_labels=plan.family_labels,
        target_qps=target_qps,
        gpu_costs=plan.gpu_costs,
        cost_models=plan.cost_models,
        wall_s=wall_s,
        num_jobs=num_jobs,
    )


# ---- outputs -------------------------------------------------------------------------------------
def config_record(run: CapacityRun, index: int) -> dict:
    """The capacity.json object of one configuration."""
    result, econ = run.results[index], run.economics[index]
    needed = econ.replicas_needed
    return {
        "config_id": f"c{result.index}",
        "label": result.label,
        "options": dataclasses.asdict(result.config),
        "max_qps": result.max_qps,
        "converged": result.outcome.converged,
        "monotone": result.outcome.monotone,
        "notes": list(result.outcome.notes),
        "num_simulations": len(result.points),
        "cost_model": run.cost_models[index],
        "slos_ms": {slo.key: slo.limit_ms for slo in run.slos},
        "cost": {
            "usd_per_gpu_hour": econ.usd_per_gpu_hour,
            "num_gpus": econ.num_gpus,
            "output_tokens_per_s": round_sig(econ.output_tokens_per_s),
            "cost_per_million_output_tokens_usd": round_sig(econ.cost_per_million_output_tokens_usd),
        },
        "pareto": {
            "latency_key": run.slos[0].key,
            "latency_ms": econ.pareto_latency_ms,
            "on_front": econ.on_pareto_front,
        },
        "replicas_needed": None if needed is None else {
            "target_qps": needed.target_qps,
            "num_replicas": needed.num_replicas,
            "extrapolated": needed.extrapolated,
            "note": needed.note,
        },
        "points": [{"iteration": i, **p.as_dict()} for i, p in enumerate(result.points)],
    }


def point_rows(run: CapacityRun) -> list[dict]:
    """capacity.parquet's rows: one per (configuration, QPS tried), nested figures flattened."""
    rows = []
    for result, econ in zip(run.results, run.economics):
        options = dataclasses.asdict(result.config)
        for iteration, point in enumerate(result.points):
            row = {"config_id": f"c{result.index}", "label": result.label, **options, "max_qps": result.max_qps,
                   "iteration": iteration}
            record = point.as_dict()
            slo_values = record.pop("slo_values_ms")
            latency = record.pop("latency_ms")
            row.update(record)
            row["is_max_qps"] = result.max_qps is not None and point.qps == result.max_qps
            row.update({f"{key}_ms": value for key, value in slo_values.items()})
            for metric_key, stats in latency.items():
                metric = metric_key.removesuffix("_ms")
                row.update({f"{metric}_{stat}_ms": value for stat, value in stats.items()})
            row["cost_per_million_output_tokens_usd"] = econ.cost_per_million_output_tokens_usd
            row["on_pareto_front"] = econ.on_pareto_front
            rows.append(row)
    return rows


def write_outputs(run: CapacityRun, out_dir: Path) -> None:
    import polars as pl

    from analysis.capacity_report import write_capacity_report

    out_dir.mkdir(parents=True, exist_ok=True)
    records = [config_record(run, i) for i in range(len(run.results))]
    (out_dir / "capacity.json").write_text(json.dumps(records, indent=2) + "\n")
    frame = pl.DataFrame(point_rows(run), infer_schema_length=None)
    frame = frame.with_columns(pl.col(name).cast(pl.Float64) for name, dtype in frame.schema.items() if dtype == pl.Null)
    frame.write_parquet(out_dir / "capacity.parquet")
    slo_text = ", ".join(str(s) for s in run.slos)
    estimate = " (an analytic estimate, not measured)" if set(run.cost_models) == {"roofline-estimate"} else ""
    write_capacity_report(
        out_dir / "report.html",
        run.results,
        run.economics,
        run.slos,
        run.family_labels,
        run.target_qps,
        run.gpu_costs,
        title=f"Capacity of {Path(run.trace_path).name} under {slo_text}",
        subtitle=(
            f"{run.num_requests} requests (recorded at {run.trace_qps:.4g} req/s), rescaled to each QPS tried; "
            f"{sum(len(r.points) for r in run.results)} simulations; cost model: {run.cost_model_text}{estimate}. "
            "Costs use illustrative list prices (edit them below)."
        ),
    )


def format_table(run: CapacityRun) -> str:
    """The printed summary: one line per configuration, then replicas needed."""
    width = max([len("configuration")] + [len(r.label) for r in run.results]) + 2
    slo_headers = [f"{s.label} ms" for s in run.slos]
    header = f"{'configuration':<{width}}{'max QPS':>10}{'sims':>6}{'goodput':>10}"
    header += "".join(f"{h:>13}" for h in slo_headers) + f"{'$/1M tok':>11}{'Pareto':>8}"
    lines = [header]
    notes = []
    for r, e in zip(run.results, run.economics):
        p = r.point_at_max
        line = f"{r.label:<{width}}{format_number(r.max_qps, '.4g') if r.max_qps is not None else 'none':>10}"
        line += f"{len(r.points):>6}{format_number(p.goodput_rps if p else None, '.4g'):>10}"
        line += "".join(f"{format_number(p.slo_values_ms.get(s.key) if p else None, '.4g'):>13}" for s in run.slos)
        cost = e.cost_per_million_output_tokens_usd
        line += f"{'-' if cost is None else f'${cost:.4g}':>11}{'yes' if e.on_pareto_front else '':>8}"
        lines.append(line)
        notes += [f"  {r.label}: {note}" for note in r.outcome.notes]
    if notes:
        lines += ["notes:"] + notes
    seen: dict[str, ConfigEconomics] = {}
    for label, e in zip(run.family_labels, run.economics):
        seen.setdefault(label, e)
    lines.append(f"replicas needed for {run.target_qps:.4g} req/s:")
    for label, e in seen.items():
        needed = e.replicas_needed
        count = "none" if needed is None or needed.num_replicas is None else str(needed.num_replicas)
        lines.append(f"  {label}: {count} ({needed.note if needed else '-'})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = run_capacity(args, parser)
    out_dir = Path(args.out) if args.out else default_out_dir("capacity", args.trace)
    write_outputs(run, out_dir)
    if not args.quiet:
        print(format_table(run))
        num_sims = sum(len(r.points) for r in run.results)
        where = f"Ray cluster {args.ray}" if args.ray else f"{run.num_jobs} local process(es)"
        print(f"cost model: {run.cost_model_text}; {num_sims} simulations in {run.wall_s:.1f} s wall on {where}; "
              f"outputs in {out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
