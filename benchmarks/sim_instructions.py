"""Simulator work in CPU instructions, before and after: ``python benchmarks/sim_instructions.py [--tree DIR ...]``.

CPU seconds on a shared 2-core machine move by 20-40 % from run to run, more than most single speed-ups, so
this counts instructions instead, which do not depend on the machine's load: valgrind's cachegrind (no cache
simulation) runs ``simulate()`` on the first ``--limit`` requests of the Azure 2023 conversation trace with the
default configuration and builds its step table (as sim.replay does before it writes steps.parquet:
benchmarks/sim_million.py does not), once per source tree, and once more without simulating (imports and trace
loading), whose count is subtracted. Each tree is a checkout of the project (``git archive COMMIT | tar -x -C DIR``);
``.`` is this one. Needs valgrind on the PATH; about a minute per tree for 5,000 requests.

``--replicas N --router NAME`` simulate a fleet; ``--sessions`` takes benchmarks/sim_million.py's synthesised
multi-turn sessions instead of ``--trace`` (``--sessions --replicas 64 --router prefix``: the million-request
benchmark's work at a size valgrind counts in minutes). Instruction counts miss what memory traffic costs (numpy's
passes over long arrays): time such changes too, alternated.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.sim_million import add_fleet_options, check_fleet_options  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"

# Run inside a tree (its folder first on the import path); SIMULATE=0 stops before the simulation.
_CHILD = """
import sys, time
sys.path.insert(0, '.')
from traces.schema import load_trace
trace = load_trace(sys.argv[1])
if sys.argv[2] == '1':
    from sim.config import SimConfig
    from sim.simulator import simulate
    config = SimConfig(num_replicas=int(sys.argv[4]), **({'router': sys.argv[5]} if sys.argv[5] else {}))
    result = simulate(trace, config, fast_forward=sys.argv[3] == '1')
    print('steps', result.steps_table().num_rows)
else:
    from sim.config import SimConfig  # the same imports as the simulating run
    from sim.simulator import simulate  # noqa: F401
"""


def count_instructions(tree: Path, trace: Path, simulate: bool, fast_forward: bool = True, num_replicas: int = 1,
                       router: str | None = None) -> tuple[int, str]:
    """valgrind's instruction count of the child in ``tree``, and what the child printed."""
    proc = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                           sys.executable, "-c", _CHILD, str(trace), "1" if simulate else "0",
                           "1" if fast_forward else "0", str(num_replicas), router or ""],
                          cwd=tree, capture_output=True, text=True, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not found:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"valgrind in {tree} failed (exit {proc.returncode}): {tail}")
    return int(found.group(1).replace(",", "")), proc.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/sim_instructions.py", description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=None,
                        help="a source tree to measure (repeatable; default: this one)")
    parser.add_argument("--label", action="append", default=None,
                        help="what each --tree is, in the same order (e.g. its commit), for the JSON")
    parser.add_argument("--trace", type=Path, default=None, help=f"the trace to replay (default: {DEFAULT_TRACE})")
    parser.add_argument("--limit", type=int, default=5000, help="the trace's first N requests")
    parser.add_argument("--qps", type=float, default=None,
                        help="rescale the slice's arrivals to this rate (traces/sharegpt.parquet at 40: ~145 a batch)")
    parser.add_argument("--no-fast-forward", action="store_true",
                        help="simulate step by step (no quiet windows): what every step of the shared core costs")
    add_fleet_options(parser)
    parser.add_argument("--json", default=None, metavar="OUT", help="write the figures here")
    args = parser.parse_args(argv)
    if args.limit < 1:
        parser.exit(2, f"error: --limit must be >= 1, got {args.limit}\n")
    check_fleet_options(parser, args)
    if args.qps is not None and not (args.qps > 0 and args.qps < float("inf")):
        parser.exit(2, f"error: --qps must be a finite number > 0, got {args.qps}\n")
    trees = [Path(t).resolve() for t in (args.tree or ["."])]
    labels = args.label or [str(tree) for tree in trees]
    if len(labels) != len(trees):
        parser.exit(2, f"error: --label: {len(labels)} labels for {len(trees)} trees; give one per --tree\n")
    for tree in trees:
        if not (tree / "sim" / "simulator.py").is_file():
            parser.exit(2, f"error: --tree: {tree} holds no sim/simulator.py\n")
    trace = None if args.sessions else args.trace or DEFAULT_TRACE
    if trace is not None and not trace.is_file():  # after the options that need no file: each named alone
        parser.exit(2, f"error: --trace: {trace} is not a file\n")
    from sim.files import check_output_path, write_text_atomic

    # Before the counting: --json onto the trace replaced it, and a folder or an unwritable path failed after it.
    problem = args.json is not None and check_output_path(args.json, "--json", [trace] if trace else [])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    from benchmarks.sim_speed import load_or_exit
    from traces.schema import save_trace

    if args.sessions:
        from benchmarks.sim_million import synthesize_sessions

        sliced = synthesize_sessions(args.limit, 10.0 * args.replicas, 0)
        sliced = sliced.with_qps(args.qps) if args.qps is not None else sliced
    else:
        sliced = load_or_exit(parser, trace, args.limit, args.qps)  # read here, before valgrind runs
    if shutil.which("valgrind") is None:
        parser.exit(2, "error: valgrind is not on the PATH (it counts the instructions)\n")

    trace_name = "benchmarks/sim_million.py sessions" if args.sessions else str(trace)
    results: dict = {"trace": trace_name, "limit": args.limit, "qps": args.qps, "replicas": args.replicas,
                     "router": args.router,
                     "fast_forward": not args.no_fast_forward, "python": sys.version.split()[0], "trees": []}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.parquet"
        save_trace(sliced, trace)  # one converted slice, read the same way by every tree
        for tree, label in zip(trees, labels, strict=True):
            try:
                total, printed = count_instructions(tree, trace, True, not args.no_fast_forward, args.replicas,
                                                    args.router)
                base, _ = count_instructions(tree, trace, False)
            except RuntimeError as exc:  # valgrind or the tree's simulator failed: its tail, not a traceback
                parser.exit(2, f"error: {' '.join(str(exc).split())[:400]}\n")
            row = {"tree": label, "simulate_instructions": total - base, "process_instructions": total,
                   "num_steps": int(printed.split()[-1])}
            results["trees"].append(row)
            print(f"{label}: simulate() {row['simulate_instructions'] / 1e9:.3f}e9 instructions "
                  f"({row['num_steps']} steps)", flush=True)
    first = results["trees"][0]["simulate_instructions"]
    for row in results["trees"]:
        row["vs_first"] = round(row["simulate_instructions"] / first, 4)
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
