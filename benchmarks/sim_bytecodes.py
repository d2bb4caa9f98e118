"""Where the simulator's work goes, in Python bytecodes: ``python benchmarks/sim_bytecodes.py [--trace T] [--limit N]``.

Counts every bytecode instruction that ``simulate()`` (and the step table sim.replay builds from it) executes, per
function, with ``sys.settrace`` opcode events: a count that, like benchmarks/sim_instructions.py's, does not depend
on the machine's load, but attributed to functions, which cachegrind's totals are not, and with no profiler's
per-call overhead skewing small functions (cProfile inflates them 2-3x). It prints bytecodes per request in all,
per file and per function, most first. Tracing is slow: 2,000 Azure requests take about two minutes.

``--qps`` rescales arrivals (``traces/sharegpt.parquet --qps 40``: the capacity sweep's batches of ~145).
``--replicas N --router NAME`` simulate a fleet, and ``--sessions`` takes benchmarks/sim_million.py's synthesised
multi-turn sessions instead of ``--trace`` (``--sessions --limit 5000 --replicas 64 --router prefix``: the
million-request benchmark's work by function, as benchmarks/sim_instructions.py counts it in all).
Compare trees with ``PYTHONHASHSEED=0`` (set iteration orders follow the seed). Bytecodes are not all alike (a
call or a numpy pass costs more than a local load): read shares, not seconds.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.sim_million import add_fleet_options, check_fleet_options  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"


def count_bytecodes(run) -> tuple[collections.Counter, collections.Counter]:
    """Bytecodes and calls per (file name, first line, function) while ``run()`` executes."""
    ops: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()

    def tracer(frame, event, _arg):
        code = frame.f_code
        key = (Path(code.co_filename).name, code.co_firstlineno, code.co_name)
        if event == "call":
            frame.f_trace_opcodes = True
            calls[key] += 1
        elif event == "opcode":
            ops[key] += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return ops, calls


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/sim_bytecodes.py", description=__doc__.split("\n\n")[1])
    parser.add_argument("--trace", type=Path, default=None,
                        help=f"Azure CSV, Mooncake JSONL or trace parquet (default: {DEFAULT_TRACE})")
    parser.add_argument("--limit", type=int, default=2000, help="replay only the first N requests (default: 2000)")
    parser.add_argument("--qps", type=float, default=None, help="rescale arrivals to this mean rate (requests/s)")
    add_fleet_options(parser)
    parser.add_argument("--top", type=int, default=30, help="functions to print (default: 30)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    if args.limit < 1 or args.top < 1:
        parser.error("--limit and --top must be at least 1")
    if args.qps is not None and not 0 < args.qps < float("inf"):
        parser.error(f"--qps must be a positive finite rate, not {args.qps}")
    check_fleet_options(parser, args)
    trace_path = None if args.sessions else args.trace or DEFAULT_TRACE
    problem = args.json is not None and check_output_path(args.json, "--json", [trace_path] if trace_path else [])
    if problem:
        parser.exit(2, f"error: {problem}\n")

    from benchmarks.sim_speed import load_or_exit
    from engine.core.config import ConfigError
    from sim.config import SimConfig
    from sim.simulator import simulate

    if args.sessions:
        from benchmarks.sim_million import synthesize_sessions

        trace = synthesize_sessions(args.limit, 10.0 * args.replicas, 0)
        trace = trace.with_qps(args.qps) if args.qps is not None else trace
    else:
        trace = load_or_exit(parser, trace_path, args.limit, args.qps)
    try:
        config = SimConfig(num_replicas=args.replicas, **({"router": args.router} if args.router else {}))
    except ConfigError as exc:
        parser.exit(2, f"error: --replicas/--router: {exc}\n")
    # Lazy imports and caches first (the step table's too): they are not the work.
    simulate(trace.head(min(len(trace), 50)), config).steps_table()
    results = []
    ops, calls = count_bytecodes(lambda: results.append(simulate(trace, config).steps_table()))
    num_requests = len(trace)
    total = sum(ops.values())
    by_file: collections.Counter = collections.Counter()
    for (file_name, _line, _name), count in ops.items():
        by_file[file_name] += count
    trace_name = "benchmarks/sim_million.py sessions" if args.sessions else str(trace_path)
    fleet = f", {args.replicas} replicas, router {config.router}" if args.replicas > 1 else ""
    print(f"{trace_name} ({num_requests} requests{f', at {args.qps:g} req/s' if args.qps else ''}{fleet}): "
          f"{total:,} bytecodes, {total / num_requests:,.0f} per request, {results[0].num_rows:,} steps")
    print("\nby file (bytecodes per request, share)")
    for file_name, count in by_file.most_common(15):
        print(f"  {count / num_requests:8,.0f}  {100 * count / total:5.1f} %  {file_name}")
    print(f"\nby function, top {args.top} (bytecodes per request, share, calls per request)")
    for (file_name, line, name), count in ops.most_common(args.top):
        print(f"  {count / num_requests:8,.0f}  {100 * count / total:5.1f} %  "
              f"{calls[(file_name, line, name)] / num_requests:7.2f}  {file_name}:{line} {name}")
    if args.json:
        figures = {
            "trace": trace_name, "num_requests": num_requests, "qps": args.qps, "replicas": args.replicas,
            "router": config.router,
            "num_steps": results[0].num_rows, "bytecodes": total,
            "bytecodes_per_request": round(total / num_requests, 1),
            "by_file": {name: count for name, count in by_file.most_common()},
            "by_function": [{"file": f, "line": line, "function": name, "bytecodes": count,
                             "calls": calls[(f, line, name)]} for (f, line, name), count in ops.most_common()],
        }
        write_text_atomic(Path(args.json), json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
