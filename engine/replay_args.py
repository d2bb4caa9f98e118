"""Command-line options shared by every replay (simulated or on a GPU) and by sweeps.

Kept free of torch and simpy so both CLIs can import it.
"""

from __future__ import annotations

import argparse


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="trace parquet (see traces/README.md; convert others with python -m traces.convert)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--qps", type=float, default=None, help="rescale arrivals to this mean rate (requests/s)")
    rate.add_argument("--time-scale", type=float, default=None, help="multiply inter-arrival gaps by this factor")
    rate.add_argument("--offline", action="store_true", help="every request arrives at t=0 (an offline batch)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="qwen3-0.6b", help="shipped model config name or HF model dir (default: %(default)s)")
    g.add_argument("--policy", default="mixed", choices=["mixed", "nano"], help="scheduling policy (default: %(default)s)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most sequences in one step (default: %(default)s)")
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="token budget of one step (default: %(default)s)"
    )
    g.add_argument("--block-size", type=int, default=256, help="tokens per KV block (default: %(default)s)")
    g.add_argument(
        "--num-gpu-blocks", type=int, default=None, help="KV blocks per replica (default: sized from GPU memory)"
    )
    g.add_argument("--max-model-len", type=int, default=None, help="longest prompt+output (default: the model's)")
    g.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory used (default: %(default)s)"
    )
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per replica (default: %(default)s)")
    g.add_argument("--no-prefix-caching", action="store_true", help="disable the prefix cache")
    g.add_argument("--seed", type=int, default=0, help="seed for synthesized prompt tokens (default: %(default)s)")


def load_trace_for_replay(args: argparse.Namespace):
    """The trace with --limit, then --qps or --time-scale, applied."""
    from traces.schema import load_trace

    trace = load_trace(args.trace)
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        trace = trace.head(args.limit)
    if args.qps is not None:
        if args.qps <= 0:
            raise ValueError(f"--qps must be > 0, got {args.qps}")
        trace = trace.with_qps(args.qps)
    elif args.time_scale is not None:
        if args.time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {args.time_scale}")
        trace = trace.with_time_scale(args.time_scale)
    elif args.offline:
        trace = trace.offline()
    return trace
