"""Replay a request trace in simulation: ``python -m sim.replay TRACE [options]``.

Writes requests.parquet, steps.parquet, summary.json and report.html to --out and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.replay_args import add_engine_arguments, add_trace_arguments, load_trace_for_replay
from sim.hardware import GPUS
from sim.router import ROUTERS
from sim.simulator import SimConfig, SimResult, make_cost_model, simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim.replay",
        description="Replay a request trace on simulated GPU replicas that run the engine's own scheduler.",
    )
    add_trace_arguments(parser)
    add_engine_arguments(parser)
    g = parser.add_argument_group("deployment")
    g.add_argument("--gpu", default="h200", choices=sorted(GPUS), help="GPU type (default: %(default)s)")
    g.add_argument("--replicas", type=int, default=1, help="number of engine replicas (default: %(default)s)")
    g.add_argument("--router", default="rr", choices=sorted(ROUTERS), help="request router (default: %(default)s)")
    g.add_argument(
        "--cost-model", default="auto",
        help="auto (a measured profile from sim/profiles/ when one matches --model, --gpu and TP, else the roofline "
        "estimate), roofline, or a profile JSON path (default: %(default)s)",
    )
    g.add_argument(
        "--host-slowdown", default="calibrated",
        help="how much slower than on the profiling grid the serving host runs: calibrated (the profile's measured "
        "serving average), a number, episodes:NORMAL,SLOW,FRACTION,MEAN_S (seeded random slow periods), or a CSV of "
        "start_s,slowdown (python -m sim.host_speed) (default: %(default)s)",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--out", default=None, help="output folder (default: a new folder under runs/)")
    out.add_argument("--no-report", action="store_true", help="skip report.html")
    out.add_argument("--quiet", action="store_true", help="no progress bar and no summary table")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        model=args.model,
        gpu=args.gpu,
        num_replicas=args.replicas,
        router=args.router,
        policy=args.policy,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        seed=args.seed,
        cost_model=args.cost_model,
        host_slowdown=args.host_slowdown,
    )


def default_out_dir(prefix: str, trace_path: str) -> Path:
    stem = Path(trace_path).stem
    base = Path("runs") / f"{prefix}-{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = base
    n = 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def write_outputs(result: SimResult, out_dir: Path, trace_path: str, report: bool) -> dict:
    import polars as pl
    import pyarrow.parquet as pq

    from analysis.metrics import add_latency_columns, summarize

    out_dir.mkdir(parents=True, exist_ok=True)
    requests = add_latency_columns(pl.from_arrow(result.requests_table()))
    requests = requests.sort("arrival_s", "request_id", maintain_order=True)
    steps = pl.from_arrow(result.steps_table())
    requests.write_parquet(out_dir / "requests.parquet")
    pq.write_table(steps.to_arrow(), out_dir / "steps.parquet")
    summary = summarize(requests, steps)
    summary["cost_model"] = result.cost_model_name
    summary["trace"] = str(trace_path)
    summary["config"] = result.describe()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if report:
        from analysis.report import write_report

        estimate = " (an analytic estimate, not measured)" if result.cost_model_name == "roofline-estimate" else ""
        cfg = result.config
        write_report(
            requests,
            steps,
            summary,
            out_dir / "report.html",
            title=f"Simulated replay of {Path(trace_path).name}",
            subtitle=(
                f"{cfg.model} on {cfg.num_replicas}x {cfg.gpu} (TP={cfg.tensor_parallel_size}), policy {cfg.policy}, "
                f"router {cfg.router}; cost model: {result.cost_model_name}{estimate}"
            ),
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        trace = load_trace_for_replay(args)
        shape = config.model_shape
        config.scheduler_config(shape)  # fail on bad options before simulating
        make_cost_model(config, shape)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    out_dir = Path(args.out) if args.out else default_out_dir("sim", args.trace)
    if out_dir.exists() and not out_dir.is_dir():
        parser.exit(2, f"error: --out {out_dir} exists and is not a folder\n")
    progress = None
    if not args.quiet:
        from tqdm import tqdm

        progress = tqdm(total=len(trace), unit="req", desc="simulating", mininterval=0.5, file=sys.stderr)
    result = simulate(trace, config, on_request_done=progress.update if progress else None)
    result.meta.update(qps=args.qps, time_scale=args.time_scale, limit=args.limit, offline=args.offline)
    if progress is not None:
        progress.close()
    summary = write_outputs(result, out_dir, args.trace, report=not args.no_report)
    if not args.quiet:
        from analysis.metrics import format_summary_table

        print(format_summary_table(summary))
        print(f"cost model: {result.cost_model_name}; simulated in {result.wall_s:.1f} s wall; outputs in {out_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
