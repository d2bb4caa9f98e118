"""Capacity planning by simulation: ``python -m analysis.capacity TRACE --slo ttft_p90=2s,tpot_p90=100ms``.

For every configuration in the cross product of the comma-separated options (models, GPUs, replica
counts, policies, ...) and every seed, bisect on the offered load for the highest QPS that meets every
SLO and is stable, each QPS being a steady stream of the trace's sessions (`workload`); the answer is
simulated again on a stream twice as long, and the configuration's answer is the median over seeds.
Writes to --out:

- ``capacity.json``: a list, one object per configuration: ``config_id``, ``label``, ``options``
  (every simulator option), ``max_qps`` (null when no QPS tried passed), ``max_qps_kind``,
  ``max_qps_by_seed``, ``max_qps_spread``, ``max_qps_band`` (with ``--bands``: p5, median, p95),
  ``converged``, ``monotone``, ``notes``, ``num_simulations``,
  ``slos_ms``, ``cost``, ``pareto``, ``replicas_needed`` and ``searches`` (per seed: the points tried, in
  order, with their SLO values, stability figures and latencies, and the duration checks).
- ``capacity.parquet``: one row per simulation, the same figures flattened.
- ``report.html``: the charts (one offline file).

Module map (all in `analysis.capacity`): `plan` (validate, then run), `workload` (the streams),
`stability` and `slo_check` (the per-replay verdict), `point` (one simulation), `bisection` (the
search), `sweep`, `executors` and `ray_executor` (cross product, seeds, parallel execution), `cost`
(cost, Pareto, replicas needed), `outputs` and `report` (the files). See analysis/README.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis.capacity.cost import (
    DEFAULT_GPU_COST_PER_HOUR_USD,
    replicas_needed_by_family,
)
from analysis.capacity.outputs import write_outputs
from analysis.capacity.plan import CapacityRun, run_capacity
from analysis.capacity.sweep import ANSWER_KINDS, SWEEP_AXES, SweepError, answer_text
from analysis.capacity.workload import (
    DEFAULT_MAX_REQUESTS,
    MAX_STREAM_REQUESTS,
    MIN_MAX_REQUESTS,
    THINK_TIME_MODES,
    StreamTooLong,
    WorkloadParams,
)
from analysis.console import print_out
from analysis.formatting import format_number
from analysis.outdir import OutDirError, default_out_dir, folder_complete, input_files, out_folder, staged_out_dir
from analysis.slo import SLO, parse_slos
from engine.core.config import SCHEDULING_POLICIES
from engine.core.config_args import OneLineErrorParser, add_config_arguments, field_names
from engine.core.interrupt import exit_130_on_interrupt, outputs_in_place
from engine.core.messages import escape_controls
from sim.config import SimConfig
from sim.hardware import get_gpu
from sim.router import ROUTERS


def comma_list(parse_item: Callable[[str], object],
               identity: Callable[[object], object] | None = None) -> Callable[[str], tuple]:
    """An argparse type for ``a,b,c``; argparse prefixes its errors with the option's name. ``identity`` maps a
    value to what makes two values one (a model's folder: a shipped name and its path are one model)."""

    def parse(text: str) -> tuple:
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or any(not item for item in items):
            raise argparse.ArgumentTypeError(f"empty list or empty item in {text!r}; expected e.g. a,b,c")
        values = tuple(parse_item(item) for item in items)
        duplicates = sorted({str(v) for v in values if values.count(v) > 1})
        if duplicates:
            raise argparse.ArgumentTypeError(f"{', '.join(duplicates)} given twice in {text!r}")
        if identity is not None:
            first_of: dict = {}
            for value in values:
                same = first_of.setdefault(identity(value), value)
                if same != value:
                    raise argparse.ArgumentTypeError(f"{same} and {value} in {text!r} are the same "
                                                     f"({identity(value)}); give it once")
        return values

    return parse


def _converted(text: str, convert, noun: str):
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def positive_int(text: str) -> int:
    value = _converted(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def positive_float(text: str) -> float:
    value = _converted(text, float, "a number")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number > 0")
    return value


# A billion requests per second is beyond any fleet; larger rates overflowed the stream's request count and the
# replica counts (--qps-max 1e308, --target-qps 1e308 were tracebacks).
MAX_QPS = 1e9


def rate(text: str) -> float:
    value = positive_float(text)
    if value > MAX_QPS:
        raise argparse.ArgumentTypeError(f"{text} requests/s is above the limit of {MAX_QPS:g}")
    return value


def seed_count(text: str) -> int:
    """--seeds: each is a whole search, as each band replay is (sim.bands caps those at MAX_REPLAYS)."""
    from sim.bands import MAX_REPLAYS

    value = positive_int(text)
    if value > MAX_REPLAYS:
        raise argparse.ArgumentTypeError(f"{value} is more than {MAX_REPLAYS} searches per configuration")
    return value


def non_negative_int(text: str) -> int:
    value = _converted(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def seed_offset(text: str) -> int:
    """--seed-offset: the seeds it starts stay below 2**63 (as --seed's), the parquet's int64 seed column; an offset
    past it made an Int128 column pyarrow cannot read."""
    from sim.bands import MAX_REPLAYS  # the most searches a configuration runs (--seeds, --bands)

    value = non_negative_int(text)
    if value + MAX_REPLAYS > 2**63:
        raise argparse.ArgumentTypeError(f"{value} must be at most 2**63 - {MAX_REPLAYS} (each search's seed is the "
                                         "offset plus its number, and seeds are below 2**63)")
    return value


def max_request_count(text: str) -> int:
    """--max-requests: a whole number of requests a stream may hold, from MIN_MAX_REQUESTS to MAX_STREAM_REQUESTS."""
    if len(text.strip()) > 30:  # int() of thousands of digits is a ValueError about Python's digit limit
        raise argparse.ArgumentTypeError(f"{text[:30]}... is not an integer from {MIN_MAX_REQUESTS} to "
                                         f"{MAX_STREAM_REQUESTS:,}")
    value = _converted(text, int, "an integer")
    if not MIN_MAX_REQUESTS <= value <= MAX_STREAM_REQUESTS:
        raise argparse.ArgumentTypeError(f"{value} must be from {MIN_MAX_REQUESTS} (fewer measured requests are "
                                         f"noise) to {MAX_STREAM_REQUESTS:,} (what one simulation takes)")
    return value


def non_negative_float(text: str) -> float:
    value = _converted(text, float, "a number")
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number >= 0")
    return value


def model_name(text: str) -> str:
    from engine.core.model_config import ModelShape

    try:
        ModelShape.load(text)
    except (FileNotFoundError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def model_identity(name: str) -> Path:
    """The folder a --model value reads: qwen3-0.6b and engine/configs/qwen3-0.6b were swept as two models, each
    configuration simulated twice under two names."""
    from engine.core.model_config import resolve_model_dir

    return resolve_model_dir(name).resolve()


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


def ray_address(text: str) -> str:
    """--ray: an empty address (an unset shell variable) ran every simulation locally without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; expected auto, HOST:PORT or ray://HOST:10001")
    return text


def slo_list(text: str) -> tuple[SLO, ...]:
    try:
        return parse_slos(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# How one item of each swept comma list is read; SimConfig then validates the combination.
SWEEP_ITEM_TYPES: dict[str, Callable[[str], object]] = {
    "model": model_name,
    "gpu": gpu_name,
    "num_replicas": positive_int,
    "tensor_parallel_size": positive_int,
    "policy": choice_of(SCHEDULING_POLICIES, "policy"),
    "max_num_seqs": positive_int,
    "router": choice_of(list(ROUTERS), "router"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m analysis.capacity",
        description=(
            "Find, by simulation, the highest QPS each configuration serves within latency SLOs. Comma lists in "
            "--model, --gpu, --replicas, --tensor-parallel-size, --policy, --max-num-seqs and --router form a "
            "cross product; each configuration is bisected on QPS (the trace's arrivals rescaled)."
        ),
        epilog="example: python -m analysis.capacity traces/sharegpt.parquet --slo ttft_p90=2s,tpot_p90=100ms "
        "--replicas 1,2 --policy mixed,nano --target-qps 100",
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
    # Every simulator option, generated from SimConfig's fields as in sim.replay; the swept ones take comma lists.
    add_config_arguments(parser.add_argument_group("engine and deployment (as in python -m sim.replay)"), SimConfig,
                         [name for name in field_names(SimConfig) if name not in SWEEP_AXES])
    add_config_arguments(
        parser.add_argument_group("sweep (comma lists; their cross product is swept)"), SimConfig, list(SWEEP_AXES),
        types={name: comma_list(parse_item, model_identity if name == "model" else None)
               for name, parse_item in SWEEP_ITEM_TYPES.items()},
    )
    search = parser.add_argument_group("search")
    search.add_argument("--qps-min", type=rate, default=None,
                        help="lower end of the QPS bracket (default: found automatically)")
    search.add_argument("--qps-max", type=rate, default=None,
                        help="upper end of the QPS bracket (default: found automatically, starting at the trace's "
                        "own rate and doubling or halving)")
    search.add_argument("--tolerance", type=float, default=0.05,
                        help="stop when (fail - pass) / pass <= this (default: %(default)s)")
    search.add_argument("--max-iterations", type=positive_int, default=20,
                        help="most simulations per configuration (default: %(default)s)")
    search.add_argument("--candidates-per-round", type=positive_int, default=1,
                        help="QPS values of one configuration simulated at once (k-section search; uses more "
                        "cores per configuration, and can reveal non-monotone latency) (default: %(default)s)")
    steady = parser.add_argument_group(
        "steady state (each QPS is a stream of the trace's sessions, resampled; see analysis/README.md)")
    steady.add_argument("--min-duration-s", type=non_negative_float, default=WorkloadParams.min_duration_s,
                        help="simulate at least this many seconds of arrivals per QPS (default: %(default)s)")
    steady.add_argument("--min-requests", type=non_negative_int, default=WorkloadParams.min_requests,
                        help="... and at least this many requests (default: %(default)s)")
    steady.add_argument("--max-requests", type=max_request_count, default=None,
                        help="... and at most this many requests (the check of an answer twice as many): a stream "
                        "that would hold more in --min-duration-s is shortened, and the notes say so (default: "
                        f"{DEFAULT_MAX_REQUESTS:,}, or --min-requests when higher)")
    steady.add_argument("--warmup-fraction", type=float, default=WorkloadParams.warmup_fraction,
                        help="share of the stream served but not measured, as the replicas start empty "
                        "(default: %(default)s)")
    steady.add_argument("--think-times", choices=THINK_TIME_MODES, default=WorkloadParams.think_times,
                        help="keep: a session's turns keep their recorded gaps and more sessions start to raise "
                        "the load; scale: the gaps shrink with the load, as a plain rescaled trace (default: "
                        "%(default)s)")
    steady.add_argument("--stability-tolerance", type=float, default=WorkloadParams.stability_tolerance,
                        help="a QPS is stable when completions keep within this share of arrivals and the "
                        "backlog grows by less than this share of the arrival rate (default: %(default)s)")
    steady.add_argument("--seeds", type=seed_count, default=1,
                        help="independent streams per configuration; the answer is the median max QPS "
                        "(default: %(default)s)")
    steady.add_argument("--seed-offset", type=seed_offset, default=0,
                        help="the first stream's seed (default: %(default)s)")
    steady.add_argument("--bands", default=None, metavar="N",
                        help="N seeded searches, each a band replay of sim.replay --bands (its own stream seed, "
                             "host-speed episodes and cost-model offsets): max QPS as median and p5-p95 "
                             "(capacity.json max_qps_band); instead of --seeds")
    steady.add_argument("--no-early-stop", action="store_true",
                        help="simulate every load in full: no stop after a third of a clearly overloaded stream "
                             "(tried only while no load of a search has passed), nor once a TTFT or queue-time SLO is "
                             "certainly missed (after a load has passed)")
    steady.add_argument("--no-duration-check", action="store_true",
                        help="skip simulating each answer again on a stream twice as long")
    cost = parser.add_argument_group("capacity planning")
    cost.add_argument("--target-qps", type=rate, default=None,
                      help="load to size replicas for (default: the trace's own mean rate)")
    defaults = ",".join(f"{gpu}={price:g}" for gpu, price in DEFAULT_GPU_COST_PER_HOUR_USD.items())
    cost.add_argument("--gpu-cost", default=None,
                      help=f"USD per GPU-hour as gpu=price pairs or a file (JSON object or gpu=price lines); "
                      f"overrides the illustrative list prices {defaults}")
    run = parser.add_argument_group("execution")
    run.add_argument("--jobs", type=positive_int, default=None,
                     help="local processes (default: the cores available); results do not depend on it")
    run.add_argument("--ray", type=ray_address, default=None, metavar="ADDRESS",
                     help="run the simulations on this Ray cluster: auto (the one this machine belongs to), "
                     "HOST:PORT (its head, from a node of the cluster) or ray://HOST:10001 (Ray Client, from "
                     "anywhere); files named by options travel with the job (pip install -e '.[ray]')")
    run.add_argument("--ray-connect-timeout-s", type=positive_float, default=None, metavar="SECONDS",
                     help="how long to wait for ray.init once the address answers as Ray (default 60; it starts "
                     "a client process and uploads the project's packages)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=out_folder, default=None, help="output folder (default: a new folder under runs/)")
    out.add_argument("--overwrite", action="store_true", help="replace --out if it exists and is not empty")
    out.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    return parser


def format_table(run: CapacityRun) -> str:
    """The printed summary: one line per configuration, then replicas needed."""
    # Labels name --model folders: their control characters escaped (an ANSI escape or a newline was printed raw).
    labels = [escape_controls(r.label) for r in run.results]
    width = max([len("configuration")] + [len(label) for label in labels]) + 2
    slo_headers = [f"{s.label} ms" for s in run.slos]
    header = f"{'configuration':<{width}}{'max QPS':>10}{'seeds':>14}{'sims':>6}{'goodput':>10}"
    header += "".join(f"{h:>13}" for h in slo_headers) + f"{'done/arr':>10}{'backlog+':>10}"
    header += f"{'$/1M tok':>11}{'Pareto':>8}"
    lines = [header]
    notes = []
    kinds = set()
    for r, e, label in zip(run.results, run.economics, labels):
        p = r.point_at_max
        stability = p.stability if p else {}
        line = f"{label:<{width}}{r.answer_text:>10}{r.spread_text:>14}"
        line += f"{r.num_simulations:>6}{format_number(p.goodput_rps if p else None, '.4g'):>10}"
        line += "".join(f"{format_number(p.slo_values_ms.get(s.key) if p else None, '.4g'):>13}" for s in run.slos)
        line += f"{format_number(stability.get('completion_ratio'), '.3f'):>10}"
        line += f"{format_number(stability.get('backlog_growth_fraction'), '+.1%'):>10}"
        cost = e.cost_per_million_output_tokens_usd
        line += f"{format_number(cost, '.4g', prefix='$'):>11}{'yes' if e.on_pareto_front else '':>8}"
        lines.append(line)
        notes += [f"  {label}: {escape_controls(note)}" for note in r.all_notes]
        kinds.add(r.kind)
    spread = ("band replays: their p5-p95 (the perturbations of sim.replay --bands)" if run.band_replays
              else "seeds: their range")
    lines.append(f"max QPS: median over seeds ({spread}); done/arr: completions / arrivals and backlog+: "
                 "backlog growth / arrival rate, over the measured window at max QPS")
    lines += [f"  {answer_text(1.0, kind).replace('1', 'N')}: {ANSWER_KINDS[kind]}" for kind in ANSWER_KINDS
              if kind in kinds and kind != "none"]
    if notes:
        lines += ["notes:"] + notes
    lines.append(f"replicas needed for {run.target_qps:.4g} req/s:")
    for label, needed in replicas_needed_by_family(run.family_labels, run.economics).items():
        count = format_number(needed.num_replicas if needed else None, "d", missing="none")
        lines.append(f"  {escape_controls(label)}: {count} ({escape_controls(needed.note) if needed else '-'})")
    return "\n".join(lines)


@exit_130_on_interrupt("interrupted: simulations stopped, nothing written")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out_dir = Path(args.out) if args.out else default_out_dir("capacity", Path(args.trace).stem)
    if args.ray_connect_timeout_s is not None and not args.ray:  # it ran every simulation locally, the option unread
        parser.exit(2, f"error: --ray-connect-timeout-s {args.ray_connect_timeout_s:g} is how long to wait for a Ray "
                       "cluster, and no --ray ADDRESS is given; give --ray or drop the timeout\n")
    if args.ray:  # first: a wrong address should not wait for the trace and the plan to say so
        from analysis.capacity.ray_executor import check_ray

        try:
            check_ray(args.ray)
        except SweepError as exc:
            parser.exit(2, f"error: {exc}\n")
    try:
        # Made now, so a bad --out fails at once; never over an input.
        with staged_out_dir(out_dir, overwrite=args.overwrite, inputs=input_files(args)) as stage:
            run = run_capacity(args, parser)
            write_outputs(run, stage)
    except OutDirError as exc:
        parser.exit(2, f"error: {exc}\n")
    except OSError as exc:  # a full disk while writing: nothing was moved into place
        parser.exit(2, f"error: --out {out_dir}: {exc.strerror or exc}\n")
    except StreamTooLong as exc:
        parser.exit(2, f"error: {exc}; nothing written\n")
    if args.quiet:
        return 0
    with outputs_in_place(folder_complete(out_dir)):  # a Ctrl-C now says they are whole
        print_out(format_table(run))
        num_sims = sum(r.num_simulations_run for r in run.results)  # a search shared by configurations once
        where = f"Ray cluster {args.ray}" if args.ray else f"{run.num_jobs} local process(es)"
        if run.num_run_ahead:
            where += (f" ({run.num_run_ahead} run ahead of their search's verdicts on idle ones, "
                      f"{run.num_run_ahead_used} of them used)")
        print_out(f"cost model: {escape_controls(run.cost_model_text)}; {num_sims} simulations in {run.wall_s:.1f} s "
                  f"wall on {where}; outputs in {escape_controls(out_dir)}/")  # a newline in --out: one line
    return 0
