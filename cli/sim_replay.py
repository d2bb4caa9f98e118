"""Replay a request trace in simulation: ``python -m sim.replay TRACE [options]``.

Writes requests.parquet, steps.parquet, summary.json and report.html to --out and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.metrics import SUMMARY_STEP_INPUTS
from analysis.outdir import OutDirError, default_out_dir, folder_complete, input_files, staged_out_dir
from analysis.progress import progress_bar
from analysis.report.panels import REPORT_STEP_INPUTS
from analysis.report.summary_table import format_summary_table
from analysis.runs import write_summary, write_tables
from analysis.schema import MAX_TIME_S
from analysis.vllm_metrics import DEFAULT_METRIC_PERCENTILES
from cli.replay_args import (
    add_config_groups,
    add_output_arguments,
    add_trace_arguments,
    arrivals_as_asked,
    far_first_arrival_note,
    from_a_far_first_arrival,
    limited_trace,
    metric_percentiles_from_args,
    slos_from_args,
)
from engine.core.config_args import OneLineErrorParser, build_config
from engine.core.host_memory import host_memory_available
from engine.core.interrupt import InterruptedOnceWritten, exit_130_on_interrupt, outputs_in_place
from engine.core.messages import escape_controls
from sim.config import SimConfig, unused_router_note
from sim.limits import WARNING_STEP_INPUTS, format_warnings, queued_replicas, run_warnings
from sim.memory import max_steps_to_write, reusing_freed_memory
from sim.simulator import SimResult, StepLimitError, make_cost_model, simulate
from traces.requests import RequestMemoryError, check_run_memory

if TYPE_CHECKING:
    from traces.schema import Trace


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m sim.replay",
        description="Replay a request trace on simulated GPU replicas that run the engine's own scheduler.",
    )
    add_trace_arguments(parser)
    add_config_groups(parser, SimConfig, "deployment")
    add_output_arguments(parser, "output folder (default: a new folder under runs/)")
    parser.add_argument("--bands", metavar="N", default=None,
                        help="also run N seeded replays that vary the host's speed and each step's time as GPU runs "
                        "do (sim.bands), and give each metric's median and p5-p95 band (default: off)")
    return parser


def config_from_args(args: argparse.Namespace) -> SimConfig:
    return build_config(SimConfig, args)


def write_outputs(result: SimResult, out_dir: Path, trace: Trace, report: bool, slos=None,
                  bands: dict | None = None,
                  metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES) -> dict:
    """The run folder of ``result``, a replay of ``trace`` (as replayed: --limit and --qps applied)."""
    with reusing_freed_memory():  # the tables' columns and their temporaries: pages reused, not faulted in anew
        return _write_outputs(result, out_dir, trace, report, slos, bands, metric_percentiles)


def _write_outputs(result: SimResult, out_dir: Path, trace: Trace, report: bool, slos, bands: dict | None,
                   metric_percentiles: tuple[float, ...]) -> dict:
    cfg = result.config
    roofline = result.cost_model_name.startswith("roofline-estimate")  # then ", host slowdown ..." if one is given
    estimate = " (an analytic estimate, not measured)" if roofline else ""
    # The tables are built here and not kept: what only their files hold is freed once written (write_tables).
    requests, steps = write_tables(out_dir, result.requests_table(), result.steps_table(),
                                   SUMMARY_STEP_INPUTS + REPORT_STEP_INPUTS + WARNING_STEP_INPUTS)
    warnings = run_warnings(cfg, cfg.model_shape, trace.requests, steps, requests["arrival_s"].to_numpy(),
                            queued_replicas(requests))
    meta = {"cost_model": result.cost_model_name, "trace": trace.source, "config": result.describe(),
            "warnings": warnings}
    if bands is not None:
        meta["bands"] = bands
    return write_summary(
        out_dir,
        requests,
        steps,
        meta,
        report_title=f"Simulated replay of {Path(trace.source).name}" if report else None,
        report_subtitle=(
            f"{cfg.model} on {cfg.num_replicas}x {cfg.gpu} (TP={cfg.tensor_parallel_size}), policy {cfg.policy}, "
            f"router {cfg.router}; cost model: {result.cost_model_name}{estimate}"
        ),
        slos=slos,
        metric_percentiles=metric_percentiles,
    )


def run_bands_with_progress(trace, config: SimConfig, num_replays: int, num_jobs: int, slos, quiet: bool) -> dict:
    """The band replays in a local process pool of ``num_jobs`` (deterministic whatever the pool)."""
    # Imported here: a replay without --bands would pay for the process pool and capacity machinery at start-up.
    from analysis.bands import run_bands

    with progress_bar(quiet, total=num_replays, unit="replay", desc="bands") as progress:
        return run_bands(trace, config, num_replays, slos=slos, num_jobs=num_jobs,
                         on_replay_done=progress.update if progress else None)


def trace_to_simulate(args: argparse.Namespace) -> tuple[Trace, float | None]:
    """The trace with --limit, --qps, --time-scale or --offline applied, its arrivals counted from its first where
    that one is far from 0 s (from_a_far_first_arrival), and the time it arrived at then (None otherwise)."""
    trace, shifted_s = limited_trace(args), None
    if not args.offline:  # (which sets every arrival to 0 s)
        # Before --qps or --time-scale rescale the gaps: rescaled on the far clock, each arrival would be rounded to
        # its coarse digits again.
        trace, shifted_s = from_a_far_first_arrival(trace)
    return arrivals_as_asked(trace, args), shifted_s


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
        trace, shifted_s = trace_to_simulate(args)
        slos = slos_from_args(args)
        metric_percentiles = metric_percentiles_from_args(args)
        num_replays = None
        if args.bands is not None:
            from sim.bands import check_num_replays

            num_replays = check_num_replays(args.bands)
        shape = config.model_shape
        trace.check_vocabulary(shape.vocab_size)  # a stored prompt id beyond the model's failed mid-run
        resolved = config.resolved_for(shape)  # fail on bad options before simulating
        make_cost_model(config, shape)
        # The whole trace is simulated and its outputs written: a trace too large for the host's memory is refused
        # now, not killed by the kernel after many minutes (a capacity sweep simulates shorter streams of it).
        # With --bands, the main run is held while its replays run beside it, one per core: as many as fit.
        band_jobs = 0
        if num_replays is not None:
            from analysis.capacity.executors import default_num_jobs  # (the pool's machinery: only with --bands)

            band_jobs = min(num_replays, default_num_jobs())
        band_jobs = check_run_memory(trace, resolved, host_memory_available(), num_replays=num_replays or 0,
                                     max_parallel_replays=band_jobs)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {escape_controls(exc)}\n")  # a path's newline too: one line
    if shifted_s is not None:
        print(escape_controls(far_first_arrival_note(args.trace, shifted_s)), file=sys.stderr)
    router_note = unused_router_note(config.router, config.num_replicas)
    if router_note:
        print(router_note, file=sys.stderr)
    out_dir = Path(args.out) if args.out else default_out_dir("sim", Path(args.trace).stem)
    try:
        # Made now, so a bad --out fails at once; never over an input.
        with staged_out_dir(out_dir, overwrite=args.overwrite, inputs=input_files(args)) as stage:
            with progress_bar(args.quiet, total=len(trace), unit="req", desc="simulating", mininterval=0.5) as progress:
                result = simulate(trace, config, on_request_done=progress.update if progress else None,
                                  max_steps=max_steps_to_write(host_memory_available()))
            result.meta.update(qps=args.qps, time_scale=args.time_scale, limit=args.limit, offline=args.offline)
            if shifted_s is not None:  # the run's times are the trace's less this (only then: other runs unchanged)
                result.meta.update(arrivals_counted_from_s=shifted_s)
            bands = None
            if num_replays is not None:
                bands = run_bands_with_progress(trace, config, num_replays, band_jobs, slos, args.quiet)
            try:
                summary = write_outputs(result, stage, trace, report=not args.no_report, slos=slos, bands=bands,
                                        metric_percentiles=metric_percentiles)
            except ValueError as exc:  # the tables' own checks: times past 1e12 s
                # SystemExit unwinds through the staged folder, which removes it
                last_arrival_s = float(trace.requests["arrival_s"].max() or 0.0)
                if last_arrival_s > MAX_TIME_S / 10:  # the trace's own span, not the steps, reaches the bound
                    why = (f"the trace's arrivals reach {last_arrival_s:.3g} s, and a run's times must stay within "
                           f"{MAX_TIME_S:g} s of its start: shorten its span (--time-scale, --qps)")
                else:  # from steps priced beyond any GPU
                    why = "its steps are priced beyond any GPU: check --model, --num-gpu-blocks and --cost-model"
                parser.exit(2, f"error: the simulated run cannot be written: {exc} ({why}); nothing written to "
                               f"{out_dir}\n")
    except OSError as exc:  # a full disk or a vanished folder while writing: nothing was moved into place
        parser.exit(2, f"error: --out {out_dir}: {exc.strerror or exc}\n")
    except OutDirError as exc:
        parser.exit(2, f"error: {exc}\n")
    except (RequestMemoryError, StepLimitError) as exc:  # before or during the run: the staged folder was removed
        parser.exit(2, f"error: {exc}; nothing written to {out_dir}\n")
    except InterruptedOnceWritten:  # as the outputs moved into place: they are whole, and the line says so
        raise
    except KeyboardInterrupt:  # the staged folder was removed, the band replays stopped
        parser.exit(130, f"interrupted: nothing written to {out_dir}\n")
    with outputs_in_place(folder_complete(out_dir)):  # a Ctrl-C now says the outputs are whole
        if not args.quiet:
            print(format_summary_table(summary))
            if bands is not None:
                from analysis.bands import format_bands

                print(format_bands(bands))
            if summary["warnings"]:
                print(format_warnings(summary["warnings"]))
            print(f"cost model: {escape_controls(result.cost_model_name)}; simulated in {result.wall_s:.1f} s wall; "
                  f"outputs in {escape_controls(out_dir)}/")  # a newline in --out: still one line
    return 0
