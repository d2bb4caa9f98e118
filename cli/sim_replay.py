"""Replay a request trace in simulation: ``python -m sim.replay TRACE [options]``.

Writes requests.parquet, steps.parquet, summary.json and report.html to --out and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.outdir import OutDirError, default_out_dir, staged_out_dir
from analysis.report.summary_table import format_summary_table
from analysis.runs import write_run
from cli.replay_args import (
    add_config_groups,
    add_output_arguments,
    add_trace_arguments,
    load_trace_for_replay,
    slos_from_args,
)
from engine.core.config_args import build_config
from sim.config import SimConfig
from sim.simulator import SimResult, make_cost_model, simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim.replay",
        description="Replay a request trace on simulated GPU replicas that run the engine's own scheduler.",
    )
    add_trace_arguments(parser)
    add_config_groups(parser, SimConfig, "deployment")
    add_output_arguments(parser, "output folder (default: a new folder under runs/)")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return build_config(SimConfig, args)


def write_outputs(result: SimResult, out_dir: Path, trace_path: str, report: bool, slos=None) -> dict:
    cfg = result.config
    estimate = " (an analytic estimate, not measured)" if result.cost_model_name == "roofline-estimate" else ""
    return write_run(
        out_dir,
        result.requests_table(),
        result.steps_table(),
        {"cost_model": result.cost_model_name, "trace": str(trace_path), "config": result.describe()},
        report_title=f"Simulated replay of {Path(trace_path).name}" if report else None,
        report_subtitle=(
            f"{cfg.model} on {cfg.num_replicas}x {cfg.gpu} (TP={cfg.tensor_parallel_size}), policy {cfg.policy}, "
            f"router {cfg.router}; cost model: {result.cost_model_name}{estimate}"
        ),
        slos=slos,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        trace = load_trace_for_replay(args)
        slos = slos_from_args(args)
        shape = config.model_shape
        config.resolved_for(shape)  # fail on bad options before simulating
        make_cost_model(config, shape)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    out_dir = Path(args.out) if args.out else default_out_dir("sim", Path(args.trace).stem)
    try:
        with staged_out_dir(out_dir, overwrite=args.overwrite) as stage:  # made now: a bad --out fails at once
            progress = None
            if not args.quiet:
                from tqdm import tqdm

                progress = tqdm(total=len(trace), unit="req", desc="simulating", mininterval=0.5, file=sys.stderr)
            result = simulate(trace, config, on_request_done=progress.update if progress else None)
            result.meta.update(qps=args.qps, time_scale=args.time_scale, limit=args.limit, offline=args.offline)
            if progress is not None:
                progress.close()
            summary = write_outputs(result, stage, args.trace, report=not args.no_report, slos=slos)
    except OSError as exc:  # a full disk or a vanished folder while writing: nothing was moved into place
        parser.exit(2, f"error: --out {out_dir}: {exc.strerror or exc}\n")
    except OutDirError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not args.quiet:
        print(format_summary_table(summary))
        print(f"cost model: {result.cost_model_name}; simulated in {result.wall_s:.1f} s wall; outputs in {out_dir}/")
    return 0
