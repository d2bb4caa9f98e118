"""Simulator speed: ``python benchmarks/sim_speed.py [--limit N] [--json OUT] [--profile]``.

Replays ``../shared/traces/azure_llm_2023_conv.csv`` (19,366 requests, about one hour of the Azure
2023 conversation trace) with the simulator's default options, pinned to one CPU core where the OS
allows it, and prints the CPU seconds (and wall seconds) of the simulation itself, the simulated
seconds, steps per CPU second, and separately the CPU seconds to write the outputs (requests.parquet,
steps.parquet, summary.json, report.html) to a temporary folder. ``--repeat N`` runs it N times and
reports the median (the machine is shared: compare CPU seconds, repeated).

Target (issue 13): the whole trace, outputs included, in 3 CPU seconds or less on one core.

``--profile`` runs the simulation under cProfile (slower) and prints the top functions by
cumulative and by own time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
TARGET_CPU_S = 3.0
DEFAULT_TOP_ROWS = 20  # of each --profile table


def pin_to_one_core() -> str:
    """Run on a single CPU (the first one this process may use); says what happened."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (os.sched_setaffinity unavailable on this platform)"
    allowed = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {allowed[0]})
    return f"pinned to CPU {allowed[0]} (of {len(allowed)} allowed)"


def load(trace_path: Path, limit: int | None):
    from traces.convert import convert
    from traces.formats.base import ConvertOptions

    if trace_path.suffix == ".parquet":
        from traces.schema import load_trace

        trace = load_trace(trace_path)
        return trace.head(limit) if limit is not None else trace
    fmt = "mooncake" if trace_path.suffix == ".jsonl" else "azure"
    trace, _ = convert(fmt, trace_path, ConvertOptions(limit=limit))
    return trace


def load_or_exit(parser: argparse.ArgumentParser, trace_path: Path, limit: int | None, qps: float | None):
    """``load``, arrivals rescaled to ``qps`` if given; exit 2 with one line for a folder, a FIFO or a damaged
    file (each was a traceback)."""
    try:
        trace = load(trace_path, limit)
        return trace.with_qps(qps) if qps is not None else trace
    except OSError as exc:
        parser.exit(2, f"error: --trace {trace_path}: {exc.strerror or exc}\n")
    except ValueError as exc:  # a TraceError: it names the file, the row and what was expected
        parser.exit(2, f"error: --trace: {exc}\n")


def simulated_span_s(result) -> float:
    """First arrival to the last finish, in simulated seconds."""
    arrivals = [row[2] for row in result.request_rows]
    finishes = [row[5] for row in result.request_rows if row[5] is not None]
    return max(finishes) - min(arrivals) if arrivals and finishes else 0.0


def print_profile(profiler, top: int) -> None:
    import io
    import pstats

    for key in ("cumulative", "tottime"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).strip_dirs().sort_stats(key).print_stats(top)
        print(f"\n=== cProfile of simulate(), top {top} by {key} ===")
        # Skip pstats' preamble down to the table header.
        text = stream.getvalue()
        start = text.find("   ncalls")
        print(text[start:] if start >= 0 else text)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/sim_speed.py", description=__doc__.split("\n\n")[1])
    parser.add_argument(
        "--trace", type=Path, default=DEFAULT_TRACE,
        help="Azure CSV, Mooncake JSONL or trace parquet (default: %(default)s)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--qps", type=float, default=None,
                        help="rescale arrivals to this rate (e.g. traces/sharegpt.parquet at 40: batches of ~145)")
    parser.add_argument(  # as typed (not a Path): check_output_path reads a trailing '/' as a folder
        "--json", default=None, metavar="OUT", help="also write the figures to this JSON file"
    )
    parser.add_argument("--block-size", type=int, default=None,
                        help="tokens per KV block (default: the simulator's); with --num-gpu-blocks, a run under KV "
                             "pressure")
    parser.add_argument("--num-gpu-blocks", type=int, default=None,
                        help="KV blocks per replica (default: sized from GPU memory)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="sequences a step may batch (default: the simulator's); 1: requests queue behind each one")
    parser.add_argument("--host-slowdown", default=None,
                        help="as sim.replay's (e.g. episodes:1,1.6,0.25,4, a host whose speed varies, as --bands draws "
                             "it; default: calibrated)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin to one CPU core")
    parser.add_argument("--no-report", action="store_true", help="leave report.html out of the output-writing time")
    parser.add_argument("--compare-fast-forward", action="store_true",
                        help="first simulate step by step (no quiet windows), report both and check identical outputs")
    parser.add_argument("--profile", action="store_true", help="run simulate() under cProfile and print the hot spots")
    parser.add_argument("--top", type=int, default=None,
                        help=f"rows of each --profile table (default: {DEFAULT_TOP_ROWS})")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the median is reported")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    if args.top is not None and args.top < 1:
        parser.error(f"--top must be >= 1, got {args.top}")
    if args.top is not None and not args.profile:  # it sized a table that only --profile prints: ignored unsaid
        parser.error("--top sets the rows of --profile's tables; pass --profile or leave --top out")
    # Checked before the trace is read: --qps 0 and --block-size 3 were refused only after loading it, inf not at all.
    if args.qps is not None and not 0 < args.qps < float("inf"):
        parser.error(f"--qps must be a finite number > 0, got {args.qps}")
    if not args.trace.exists():
        parser.exit(2, f"error: trace {args.trace} does not exist (expected the shared Azure 2023 conversation CSV)\n")
    from sim.config import SimConfig
    from sim.files import check_output_path, write_text_atomic

    options = {name: value for name, value in (("block_size", args.block_size), ("num_gpu_blocks", args.num_gpu_blocks),
                                               ("max_num_seqs", args.max_num_seqs),
                                               ("host_slowdown", args.host_slowdown)) if value is not None}
    try:
        config = SimConfig(**options)
    except ValueError as exc:  # a ConfigError names its field: --block-size 3 is "--block-size: block_size must ..."
        field = getattr(exc, "field", None)
        parser.error(f"--{field.replace('_', '-')}: {exc}" if field else str(exc))
    # Before the runs: --json onto the trace replaced it, and a folder or an unwritable path failed after them.
    problem = args.json is not None and check_output_path(args.json, "--json", [args.trace])
    if problem:
        parser.exit(2, f"error: {problem}\n")

    pinning = "not pinned (--no-pin)" if args.no_pin else pin_to_one_core()

    started = time.perf_counter()
    trace = load_or_exit(parser, args.trace, args.limit, args.qps)
    load_s = time.perf_counter() - started

    from cli.sim_replay import write_outputs
    from sim.simulator import simulate

    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    baseline = None
    off_cpu_s: list[float] = []
    on_cpu_s: list[float] = []
    on_wall_s: list[float] = []
    write_cpu_s: list[float] = []
    write_wall_s: list[float] = []
    for _ in range(args.repeat):  # alternated, so a busy spell on the shared machine hits both alike
        if args.compare_fast_forward:  # the step-by-step loop first, in the same process, for a before/after
            cpu_started, started = time.process_time(), time.perf_counter()
            result_off = simulate(trace, config, fast_forward=False)
            off_cpu_s.append(time.process_time() - cpu_started)
            baseline = {"simulate_wall_s": round(time.perf_counter() - started, 3)}
        cpu_started, started = time.process_time(), time.perf_counter()
        result = simulate(trace, config)
        on_wall_s.append(time.perf_counter() - started)
        on_cpu_s.append(time.process_time() - cpu_started)
        if baseline is not None:
            identical = (result_off.requests_table().equals(result.requests_table())
                         and result_off.steps_table().equals(result.steps_table()))
            baseline["identical_outputs"] = baseline.get("identical_outputs", True) and identical
            del result_off
        with tempfile.TemporaryDirectory(prefix="sim_speed-") as out_dir:
            cpu_started, started = time.process_time(), time.perf_counter()
            summary = write_outputs(result, Path(out_dir), trace, report=not args.no_report)
            write_cpu_s.append(time.process_time() - cpu_started)
            write_wall_s.append(time.perf_counter() - started)
    if profiler is not None:
        profiler.disable()
    sim_cpu_s, sim_wall_s = statistics.median(on_cpu_s), statistics.median(on_wall_s)
    write_cpu, write_s = statistics.median(write_cpu_s), statistics.median(write_wall_s)
    if baseline is not None:
        baseline["simulate_cpu_s"] = round(statistics.median(off_cpu_s), 3)
        baseline["simulate_cpu_s_runs"] = [round(t, 3) for t in off_cpu_s]

    span_s = simulated_span_s(result)
    num_requests = len(result.request_rows)
    num_steps = sum(len(e.step_log) for e in result.engines)
    figures = {
        "trace": str(args.trace),
        "num_requests": num_requests,
        "num_finished": summary["num_finished"],
        "num_rejected": summary["num_rejected"],
        "num_steps": num_steps,
        "load_wall_s": round(load_s, 3),
        "simulate_wall_s": round(sim_wall_s, 3),
        "simulate_cpu_s": round(sim_cpu_s, 3),
        "simulate_cpu_s_runs": [round(t, 3) for t in on_cpu_s],
        "fast_forward_steps": result.num_fast_forward_steps,
        "without_fast_forward": baseline,
        "write_outputs_wall_s": round(write_s, 3),
        "write_outputs_cpu_s": round(write_cpu, 3),
        # The first is a fresh process's, as `python -m sim.replay` writes its outputs once: the later runs reuse
        # memory the first had the kernel map (and, on huge pages, compact) for them.
        "write_outputs_cpu_s_runs": [round(t, 3) for t in write_cpu_s],
        "end_to_end_cpu_s": round(sim_cpu_s + write_cpu, 3),
        "target_end_to_end_cpu_s": TARGET_CPU_S,
        "meets_target": sim_cpu_s + write_cpu <= TARGET_CPU_S,
        "report_written": not args.no_report,
        "simulated_steps_per_cpu_s": round(num_steps / sim_cpu_s, 1),
        "simulated_s": round(span_s, 3),
        "simulated_requests_per_wall_s": round(num_requests / sim_wall_s, 1),
        "simulated_steps_per_wall_s": round(num_steps / sim_wall_s, 1),
        "speedup_vs_real_time": round(span_s / sim_wall_s, 1),
        "profiled": args.profile,
        "cpu": pinning,
        "python": platform.python_version(),
        "config": {k: v for k, v in result.describe().items() if k != "simulator_wall_s"},
    }
    print(f"trace            {args.trace} ({num_requests} requests, loaded in {load_s:.2f} s)")
    print(f"cpu              {pinning}{' (under cProfile: times inflated)' if args.profile else ''}")
    if baseline is not None:
        print(f"step by step     {baseline['simulate_cpu_s']:.2f} CPU s "
              f"(last {baseline['simulate_wall_s']:.2f} s wall); "
              f"outputs {'identical' if baseline['identical_outputs'] else 'DIFFERENT'} with fast-forward")
    print(f"simulate()       {sim_cpu_s:.2f} CPU s, {sim_wall_s:.2f} s wall for {span_s:.1f} simulated s "
          f"({num_steps} steps, {result.num_fast_forward_steps} of them fast-forwarded)")
    print(f"throughput       {num_requests / sim_wall_s:.0f} simulated requests per wall s, "
          f"{num_steps / sim_wall_s:.0f} steps per wall s, {span_s / sim_wall_s:.0f}x real time")
    print(f"write outputs    {write_cpu:.2f} CPU s, {write_s:.2f} s wall"
          f"{'' if not args.no_report else ' (no report.html)'}")
    repeats = f" (medians of {args.repeat} runs)" if args.repeat > 1 else ""
    print(f"end to end       {sim_cpu_s + write_cpu:.2f} CPU s (target <= {TARGET_CPU_S:g}: "
          f"{'met' if figures['meets_target'] else 'NOT met'}){repeats}")
    print(f"finished         {summary['num_finished']} finished, {summary['num_rejected']} rejected")
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {args.json}")
    if profiler is not None:
        print_profile(profiler, args.top or DEFAULT_TOP_ROWS)
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
