"""Trace options shared by every replay (simulated or on a GPU); engine options are generated from the
config's fields (``engine.core.config_args``). Free of torch and simpy so both CLIs can import it."""

from __future__ import annotations

import argparse


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace",
                        help="trace parquet (see traces/README.md; convert others with python -m traces.convert)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--qps", type=float, default=None, help="rescale arrivals to this mean rate (requests/s)")
    rate.add_argument("--time-scale", type=float, default=None, help="multiply inter-arrival gaps by this factor")
    rate.add_argument("--offline", action="store_true", help="every request arrives at t=0 (an offline batch)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")


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
