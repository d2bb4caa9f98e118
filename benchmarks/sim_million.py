"""Fleet-scale simulator run: ``python benchmarks/sim_million.py [--requests N] [--replicas R] [--json OUT]``.

Synthesises ``--requests`` multi-turn chat requests (1,000,000 by default) whose later turns resend the
whole conversation so far (prefix reuse), and simulates them on ``--replicas`` (64) replicas of
qwen3-0.6b on H200s behind the prefix-affinity router. Prints and records the CPU seconds of the
synthesis and of the simulation, the peak resident memory of the process, the simulated steps (and
how many were fast-forwarded) and the prefix-cache hit rate. Nothing is written but the JSON: the
figures are of the simulation itself (``benchmarks/sim_speed.py`` times the outputs).

Targets (issue 13): 1M requests on 64 replicas in <= 120 s and <= 4 GB peak memory.

The trace is drawn here with numpy in one pass (``traces.synth --multi-turn`` now draws 1M requests in
seconds too, but with ShareGPT lengths and 16-token blocks; this one keeps the recorded figures
comparable): sessions start as a Poisson process, each has a geometric number of turns
separated by exponential think times, user messages and answers have log-normal lengths, and a
session's token stream is cut into 256-token hash blocks numbered per session, so turn k's prompt
is a prefix of turn k+1's.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

TARGET_S = 120.0
TARGET_PEAK_BYTES = 4 * 2**30
HASH_BLOCK_SIZE = 256
MAX_REQUESTS = 10_000_000  # ten times the full run (its 1M take ~4 GiB): beyond, the draws exhaust memory


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def add_fleet_options(parser) -> None:
    """The options with which benchmarks/sim_bytecodes.py and sim_instructions.py count a fleet's work instead of one
    replica's (``--sessions --limit 5000 --replicas 64 --router prefix``): this script's sessions, replicas, router."""
    parser.add_argument("--sessions", action="store_true",
                        help="instead of --trace, benchmarks/sim_million.py's synthesised multi-turn sessions (--limit "
                             "requests at 10 req/s per replica, seed 0): a fleet's work, with --replicas 64 --router "
                             "prefix")
    parser.add_argument("--replicas", type=int, default=1, help="replicas (default: %(default)s)")
    parser.add_argument("--router", default=None,
                        help="router of several replicas (default: the simulator's; e.g. prefix, as "
                             "benchmarks/sim_million.py runs)")


def check_fleet_options(parser, args) -> None:
    """Exit 2 with one line for fleet options (``add_fleet_options``) the simulator would refuse later: under
    valgrind that was a line quoting only its instruction count, and sessions beyond MAX_REQUESTS a numpy
    MemoryError traceback (218 TiB at 1e14)."""
    from sim.config import MAX_REPLICAS
    from sim.router import ROUTERS

    if not 1 <= args.replicas <= MAX_REPLICAS:
        parser.exit(2, f"error: --replicas must be from 1 to {MAX_REPLICAS:,}, got {args.replicas}\n")
    if args.router is not None and args.router not in ROUTERS:
        parser.exit(2, f"error: --router {args.router!r}: expected one of {', '.join(ROUTERS)}\n")
    if args.sessions and args.trace is not None:  # the sessions would replace it, unsaid
        parser.exit(2, f"error: --sessions replaces --trace {args.trace}; give one or the other\n")
    if args.sessions and args.limit > MAX_REQUESTS:
        parser.exit(2, f"error: --limit with --sessions must be at most {MAX_REQUESTS:,}, got {args.limit}\n")


def synthesize_sessions(num_requests: int, qps: float, seed: int, mean_turns: float = 4.0,
                        think_time_s: float = 20.0, user_median: float = 200.0, answer_median: float = 150.0,
                        max_context_tokens: int = 16384):
    """A ``traces.schema.Trace`` of ``num_requests`` multi-turn requests arriving at about ``qps``."""
    import numpy as np
    import polars as pl
    import pyarrow as pa

    from traces.schema import Trace

    rng = np.random.default_rng(seed)
    num_sessions = int(num_requests / mean_turns * 1.2) + 16  # more than enough; cut to num_requests below
    turns = rng.geometric(1.0 / mean_turns, num_sessions).clip(1, 16)
    session = np.repeat(np.arange(num_sessions), turns)
    first = np.zeros(num_sessions + 1, dtype=np.int64)
    np.cumsum(turns, out=first[1:])
    turn = np.arange(len(session)) - first[session]
    user = np.minimum(rng.lognormal(np.log(user_median), 1.0, len(session)), 4000).astype(np.int64) + 1
    answer = np.minimum(rng.lognormal(np.log(answer_median), 0.8, len(session)), 2000).astype(np.int64) + 1
    # Turn k's prompt is the session's stream so far (every earlier message and answer) plus message k.
    stream_end = np.cumsum(user + answer)
    stream_start = stream_end - (user + answer)
    prompt = stream_start - stream_start[first[session]] + user
    keep = prompt + answer <= max_context_tokens  # a session ends before its context would overflow
    starts_s = np.cumsum(rng.exponential(mean_turns / qps, num_sessions))
    arrival_s = _turn_arrivals(starts_s, session, turn, rng.exponential(think_time_s, len(session)))
    order = np.flatnonzero(keep)
    order = order[np.argsort(arrival_s[order], kind="stable")][:num_requests]
    # Hash blocks numbered per session (a session's stream never exceeds max_context_tokens).
    blocks_per_session = -(-max_context_tokens // HASH_BLOCK_SIZE)
    num_blocks = -(-prompt[order] // HASH_BLOCK_SIZE)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(num_blocks, out=offsets[1:])
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], num_blocks)
    ids = np.repeat(session[order] * blocks_per_session, num_blocks) + within
    hash_ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int64()))
    frame = pl.DataFrame({
        "request_id": np.arange(len(order), dtype=np.int64),
        "arrival_s": arrival_s[order] - arrival_s[order[0]],
        "prompt_tokens": prompt[order],
        "output_tokens": answer[order],
    }).with_columns(pl.from_arrow(hash_ids).cast(pl.List(pl.Int64)).alias("hash_ids"))
    return Trace.from_frame(frame, f"sim_million synthetic sessions (seed {seed})", HASH_BLOCK_SIZE)


def _git_commit() -> str | None:
    """The checked-out commit, with ``+changes`` when the tree differs from it; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "sim", "engine/core",
                                  "traces"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+changes" if changed else "")


def _turn_arrivals(starts_s, session, turn, gaps_s):
    """Each session's first turn at its start, each later turn one think time after the one before."""
    import numpy as np

    gaps_s = np.where(turn > 0, gaps_s, 0.0)
    total = np.cumsum(gaps_s)
    session_base = total[np.flatnonzero(turn == 0)]  # the running sum at each session's first turn
    return starts_s[session] + total - session_base[session]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/sim_million.py", description=__doc__.split("\n\n")[1])
    parser.add_argument("--requests", type=int, default=1_000_000, help="requests to simulate (default: %(default)s)")
    parser.add_argument("--replicas", type=int, default=64, help="replicas (default: %(default)s)")
    parser.add_argument("--qps-per-replica", type=float, default=10.0,
                        help="arrival rate per replica, requests/s (default: %(default)s)")
    parser.add_argument("--router", default="prefix", help="router (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthesized sessions (default: %(default)s)")
    # As typed (not a Path): check_output_path reads a trailing '/' as a folder, which Path would drop.
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.replicas < 1 or not 0 < args.qps_per_replica < float("inf"):
        parser.exit(2, "error: --requests and --replicas must be >= 1 and --qps-per-replica a finite number > 0\n")
    # Ten times the benchmark's size, as analysis.capacity holds one simulation to: 1e14 requests was a numpy
    # MemoryError traceback (218 TiB) while the sessions were drawn.
    if args.requests > MAX_REQUESTS:
        parser.exit(2, f"error: --requests must be at most {MAX_REQUESTS:,}, got {args.requests}\n")
    if args.seed < 0:  # numpy's "expected non-negative integer" traceback
        parser.exit(2, f"error: --seed must be an integer >= 0, got {args.seed}\n")
    from sim.files import check_output_path, write_text_atomic
    from sim.router import ROUTERS

    if args.router not in ROUTERS:  # a ConfigError traceback after synthesizing the trace
        parser.exit(2, f"error: --router {args.router!r}: expected one of {', '.join(ROUTERS)}\n")
    problem = args.json is not None and check_output_path(args.json, "--json", [])
    if problem:  # an IsADirectoryError traceback after the whole simulation
        parser.exit(2, f"error: {problem}\n")

    from engine.core.config import ConfigError
    from sim.config import SimConfig
    from sim.simulator import simulate

    try:  # before the sessions are drawn: --replicas 100000 was a ConfigError traceback after them
        config = SimConfig(num_replicas=args.replicas, router=args.router)
    except ConfigError as exc:
        parser.exit(2, f"error: --replicas: {exc}\n")
    commit = _git_commit()  # at the start: the code that runs is what was imported then
    cpu_started, started = time.process_time(), time.perf_counter()
    try:
        trace = synthesize_sessions(args.requests, args.qps_per_replica * args.replicas, args.seed)
    except ValueError as exc:  # a TraceError: --qps-per-replica 1e-300 put arrivals past the schema's bound
        parser.exit(2, f"error: --qps-per-replica {args.qps_per_replica:g}: {exc}\n")
    synth_cpu_s, synth_wall_s = time.process_time() - cpu_started, time.perf_counter() - started
    cpu_started, started = time.process_time(), time.perf_counter()
    result = simulate(trace, config)
    sim_cpu_s, sim_wall_s = time.process_time() - cpu_started, time.perf_counter() - started
    peak = peak_rss_bytes()

    rows = result.request_rows
    full_size = args.requests >= 1_000_000 and args.replicas >= 64
    num_steps = sum(len(e.step_log) for e in result.engines)
    prompt_tokens = sum(row[6] for row in rows)
    cached_tokens = sum(row[8] for row in rows)
    span_s = max(row[5] for row in rows if row[5] is not None) - min(row[2] for row in rows)
    figures = {
        "num_requests": len(rows),
        "num_replicas": args.replicas,
        "router": args.router,
        "qps": args.qps_per_replica * args.replicas,
        "mean_prompt_tokens": round(prompt_tokens / len(rows), 1),
        "prefix_cache_hit_rate": round(cached_tokens / prompt_tokens, 4),
        "synthesis_cpu_s": round(synth_cpu_s, 2),
        "synthesis_wall_s": round(synth_wall_s, 2),
        "simulate_cpu_s": round(sim_cpu_s, 2),
        "simulate_wall_s": round(sim_wall_s, 2),
        "cpu_us_per_request": round(sim_cpu_s / len(rows) * 1e6, 1),
        "num_steps": num_steps,
        "fast_forward_steps": result.num_fast_forward_steps,
        "simulated_s": round(span_s, 1),
        "peak_rss_bytes": peak,
        # The targets are for the full run; a smaller one is a measurement, not a verdict.
        "meets_time_target": sim_cpu_s <= TARGET_S if full_size else None,
        "meets_memory_target": peak <= TARGET_PEAK_BYTES if full_size else None,
        "python": platform.python_version(),
        # What ran, and how busy the shared machine was (CPU seconds grow when the other core is busy too).
        "commit": commit,
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    print(f"{len(rows)} requests on {args.replicas} replicas ({args.router} router, {figures['qps']:g} req/s): "
          f"synthesis {synth_cpu_s:.1f} CPU s, simulate {sim_cpu_s:.1f} CPU s ({sim_wall_s:.1f} s wall), "
          f"peak RSS {peak / 2**30:.2f} GiB")
    print(f"{num_steps} steps ({result.num_fast_forward_steps} fast-forwarded), {span_s:.0f} simulated s, "
          f"prefix-cache hit rate {figures['prefix_cache_hit_rate']:.1%}")
    if full_size:
        print(f"targets: <= {TARGET_S:.0f} s: {'met' if figures['meets_time_target'] else 'NOT met'}; "
              f"<= {TARGET_PEAK_BYTES / 2**30:.0f} GiB: {'met' if figures['meets_memory_target'] else 'NOT met'}")
    else:
        print("targets (1,000,000 requests on 64 replicas) not judged on a smaller run")
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
