"""Trace options shared by every replay (simulated or on a GPU); engine options are generated from the
config's fields (``engine.core.config_args``). Free of torch and simpy so both CLIs can import it."""

from __future__ import annotations

import argparse
import math

from analysis.outdir import out_folder
from engine.core.config import EngineConfig
from engine.core.config_args import add_config_arguments, field_names


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace",
                        help="trace parquet (see traces/README.md; convert others with python -m traces.convert)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--qps", type=float, default=None, help="rescale arrivals to this mean rate (requests/s)")
    rate.add_argument("--time-scale", type=float, default=None, help="multiply inter-arrival gaps by this factor")
    rate.add_argument("--offline", action="store_true", help="every request arrives at t=0 (an offline batch)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")


def add_config_groups(parser: argparse.ArgumentParser, cls, others_title: str) -> argparse._ArgumentGroup:
    """``cls``'s options in two groups: the shared engine settings (EngineConfig's and --model), and the
    rest of ``cls`` (what only this replay has) under ``others_title``; returns the second group."""
    engine_options = ["model", *field_names(EngineConfig)]
    add_config_arguments(parser.add_argument_group("engine"), cls, engine_options)
    others = parser.add_argument_group(others_title)
    add_config_arguments(others, cls, [n for n in field_names(cls) if n not in engine_options])
    return others


def add_output_arguments(parser: argparse.ArgumentParser, out_help: str, *, required: bool = False) -> None:
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=out_folder, default=None, required=required, help=out_help)
    out.add_argument("--overwrite", action="store_true",
                     help="replace --out if it holds an earlier run (never a folder holding anything else)")
    out.add_argument("--no-report", action="store_true", help="skip report.html")
    out.add_argument("--quiet", action="store_true", help="no progress output and no summary table")
    out.add_argument("--slo", default=None, metavar="SLOS",
                     help="latency SLOs for goodput in summary.json (vLLM's request_goodput: finished requests "
                          "within every limit, per second), e.g. ttft_p90=2s,tpot_p90=100ms (the syntax of "
                          "analysis.capacity)")
    out.add_argument("--metric-percentiles", default=None, metavar="PERCENTILES",
                     help="percentiles of vLLM's flat names in summary.json (p99.9_ttft_ms, ...), as vllm bench "
                          "serve's option: comma-separated, e.g. 25,50,99.9 (default: 99)")


def metric_percentiles_from_args(args: argparse.Namespace) -> tuple[float, ...]:
    """--metric-percentiles parsed (vLLM's default without it); ValueError names the option and what was expected."""
    from analysis.vllm_metrics import DEFAULT_METRIC_PERCENTILES, parse_metric_percentiles

    return _parsed_option("--metric-percentiles", args.metric_percentiles, parse_metric_percentiles,
                          DEFAULT_METRIC_PERCENTILES)


def slos_from_args(args: argparse.Namespace):
    """--slo parsed (None without it); ValueError names the option and what was expected."""
    from analysis.slo import parse_slos

    return _parsed_option("--slo", args.slo, parse_slos, None)


def _parsed_option(option: str, text: str | None, parse, default):
    """``parse(text)``, or ``default`` where the option was not given; its ValueError prefixed with ``option``."""
    if text is None:
        return default
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _finite_positive(option: str, value: float) -> float:
    """``value`` when a finite number > 0; else ValueError naming ``option`` (NaN passed a plain ``<= 0`` check
    and was refused later by a message that named no option)."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{option} must be > 0 and finite, got {value}")
    return value


# A replay over HTTP or through the real engine runs in real time: it sleeps until each arrival.
MAX_REPLAY_SPAN_S = 30 * 24 * 3600


def check_real_time_span(trace, trace_path: str) -> None:
    """ValueError for a trace whose arrivals span more than MAX_REPLAY_SPAN_S after --qps/--time-scale: a real-time
    replay would sleep for that long (or overflow the sleep)."""
    span_s = float(trace.requests["arrival_s"][-1] - trace.requests["arrival_s"][0])
    if span_s > MAX_REPLAY_SPAN_S:
        raise ValueError(f"{trace_path}: the arrivals span {span_s:.6g} s after --qps/--time-scale; a real-time "
                         f"replay is limited to {MAX_REPLAY_SPAN_S:,} s (30 days): use --qps or --time-scale")


def from_a_far_first_arrival(trace) -> tuple[object, float | None]:
    """A trace whose first request arrives more than MAX_REPLAY_SPAN_S from 0 s (Unix timestamps as arrival_s, ~1.7e9)
    with its arrivals counted from that request, and the time it arrived at; the trace itself and None otherwise.

    A simulation on the timestamps' own clock kept too few of a float's digits for its step times: a float's step is
    2.4e-7 s at 1.7e9 s, where every TTFT of 200 ShareGPT requests differed from the same trace's counted from 0 s
    (up to 0.09 %), and 1.2e-4 s at 2**39 s, where the replay took 21 steps more and TTFTs were up to 34 % off.
    engine.replay refuses such a trace (its real-time clock would idle until the first request) and asks for this
    very shift."""
    first_s = float(trace.requests["arrival_s"][0])
    if not first_s > MAX_REPLAY_SPAN_S:
        return trace, None
    return trace.from_first_arrival(), first_s


def far_first_arrival_note(trace_path: str, first_s: float) -> str:
    return (f"note: {trace_path}: the first request arrives at {first_s:.10g} s, more than 30 days from the trace's "
            "start (Unix timestamps?); arrival times are counted from it, so the run starts at 0 s")


def load_trace_for_replay(args: argparse.Namespace):
    """The trace with --limit, then --qps or --time-scale, applied."""
    return arrivals_as_asked(limited_trace(args), args)


def limited_trace(args: argparse.Namespace):
    """The trace with --limit applied."""
    from traces.schema import load_trace

    trace = load_trace(args.trace)
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        trace = trace.head(args.limit)
    return trace


def arrivals_as_asked(trace, args: argparse.Namespace):
    """``trace`` with --qps, --time-scale or --offline applied."""
    if args.qps is not None:
        trace = trace.with_qps(_finite_positive("--qps", args.qps))
    elif args.time_scale is not None:
        trace = trace.with_time_scale(_finite_positive("--time-scale", args.time_scale))
    elif args.offline:
        trace = trace.offline()
    return trace
