"""Capacity-sweep speed: ``python benchmarks/capacity_speed.py [--jobs N] [--json OUT] [--sweep ARGS]``.

Runs the default sweep, ``python -m analysis.capacity traces/sharegpt.parquet --slo
ttft_p90=2s,tpot_p90=100ms`` (one configuration: qwen3-0.6b on an H200, default steady-state options:
240 s streams, one seed, the 2T check), in-process, or the sweep ``--sweep`` gives. Prints the number of
simulations, the wall seconds of the sweep, of writing the outputs and of the whole command (start-up of the
worker processes included), and the CPU seconds of this process and its workers (compare those on a shared
machine); with ``--jobs 1`` also the requests simulated, early-stop probes included (the same on any machine).

Target (issue 15): the whole command in 60 s or less on a 2-core CPU machine.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

TARGET_S = 60.0
SWEEP = [str(REPO / "traces" / "sharegpt.parquet"), "--slo", "ttft_p90=2s,tpot_p90=100ms", "--quiet"]
# The sweep's options this script gives it itself, and why
SET_HERE = {"--jobs": "give --jobs to this script", "--out": "the timed sweep writes to a temporary folder"}


def _cpu_s() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _count_simulated_requests() -> dict:
    """Counts every request the capacity points simulate in this process (their ``simulate`` wrapped)."""
    import analysis.capacity.point as point

    counts = {"requests": 0, "calls": 0}
    simulate = point.simulate

    def counting(trace, *args, **kwargs):
        result = simulate(trace, *args, **kwargs)
        # A run stopped early (a certain SLO miss) simulated the requests that had arrived by then.
        arrivals_s = trace.requests["arrival_s"]
        counts["requests"] += len(trace) if result.stopped_s is None else int((arrivals_s <= result.stopped_s).sum())
        counts["calls"] += 1
        return result

    point.simulate = counting
    return counts


def main(argv: list[str] | None = None) -> int:
    from analysis.capacity.cli import build_parser, positive_int
    from analysis.capacity.executors import default_num_jobs
    from analysis.capacity.outputs import write_outputs
    from analysis.capacity.plan import run_capacity
    from sim.files import check_output_path, write_text_atomic

    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    # positive_int: --jobs 0 or -1 was refused only by the sweep's own parser, under its usage line.
    parser.add_argument("--jobs", type=positive_int, default=default_num_jobs(),
                        help="local processes (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the figures to this JSON file")
    parser.add_argument("--sweep", default=None, metavar="ARGS",
                        help="python -m analysis.capacity's trace and options, as one string, instead of the default "
                             "sweep's (e.g. \"traces/sharegpt.parquet --slo ttft_p90=2s,tpot_p90=100ms --replicas 2\")")
    args = parser.parse_args(argv)
    try:
        sweep = SWEEP if args.sweep is None else [*shlex.split(args.sweep), "--quiet"]
    except ValueError as exc:  # an unclosed quote
        parser.exit(2, f"error: --sweep: {exc}\n")
    if sweep[0].startswith("-"):
        parser.exit(2, f"error: --sweep must start with the trace, got {args.sweep!r}\n")
    # This script sets both: given in the sweep too, its parser said "--out is given twice", naming neither --sweep
    # nor what to do instead.
    owned = next((token.split("=")[0] for token in sweep if token.split("=")[0] in SET_HERE), None)
    if owned:
        parser.exit(2, f"error: --sweep {args.sweep!r}: {owned} is set here ({SET_HERE[owned]}); leave it out of "
                       "--sweep\n")
    # Before the sweep: --json onto the trace replaced it, and a folder or an unwritable path failed after the run.
    problem = args.json is not None and check_output_path(args.json, "--json", [Path(sweep[0])])
    if problem:
        parser.exit(2, f"error: {problem}\n")

    counted = _count_simulated_requests() if args.jobs == 1 else None
    started, cpu_started = time.perf_counter(), _cpu_s()
    with tempfile.TemporaryDirectory() as out:
        capacity_parser = build_parser()
        capacity_args = capacity_parser.parse_args(sweep + ["--jobs", str(args.jobs), "--out", out])
        run = run_capacity(capacity_args, capacity_parser)
        written = time.perf_counter()
        write_outputs(run, Path(out))
        outputs_s = time.perf_counter() - written
    total_s = time.perf_counter() - started
    cpu_s = _cpu_s() - cpu_started
    num_simulations = sum(r.num_simulations for r in run.results)
    figures = {
        "sweep": " ".join(sweep),
        "num_simulations": num_simulations,
        "num_configurations": len(run.results),
        "num_jobs": run.num_jobs,
        # Simulations run ahead of their search's verdicts on idle workers, and how many a search then took
        # (analysis.capacity.speculation; none with one process).
        "num_run_ahead": run.num_run_ahead,
        "num_run_ahead_used": run.num_run_ahead_used,
        "sweep_wall_s": round(run.wall_s, 2),
        "outputs_wall_s": round(outputs_s, 2),
        "total_wall_s": round(total_s, 2),
        "cpu_s": round(cpu_s, 2),
        # Every request each simulation took, early-stop probes included (counted with --jobs 1 only: the
        # simulations then run in this process); unlike CPU seconds, the same on any machine.
        "requests_simulated": None if counted is None else counted["requests"],
        "simulate_calls": None if counted is None else counted["calls"],
        "max_qps": {r.label: r.max_qps for r in run.results},
        "max_qps_kind": {r.label: r.kind for r in run.results},
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    verdict = "PASS" if total_s <= TARGET_S else "FAIL"
    print(
        f"{num_simulations} simulations ({len(run.results)} configuration(s)) on {run.num_jobs} process(es): "
        f"sweep {run.wall_s:.1f} s, outputs {outputs_s:.1f} s, total {total_s:.1f} s wall, {cpu_s:.1f} CPU s "
        f"(target <= {TARGET_S:.0f} s wall: {verdict})"
    )
    if run.num_run_ahead:
        print(f"{run.num_run_ahead} simulations run ahead of their search's verdicts, {run.num_run_ahead_used} used")
    if counted is not None:
        print(f"{counted['requests']:,} requests simulated in {counted['calls']} simulate() calls")
    print("max QPS: " + ", ".join(f"{label} {qps}" for label, qps in figures["max_qps"].items()))
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(figures, indent=2) + "\n")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
