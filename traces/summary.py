"""One-line summaries of a trace, printed by the CLIs so a run shows what it wrote."""

from __future__ import annotations

import math

from engine.core.messages import counted, escape_controls
from traces.schema import Trace


def shown_span(span_s: float) -> str:
    """Seconds to three decimals, or three significant digits below a millisecond: not 0.000 for a span."""
    return f"{span_s:.3f}" if span_s == 0 or span_s >= 0.001 else f"{span_s:.3g}"


def describe(trace: Trace, destination: str, dropped: str = "") -> str:
    """`wrote N requests to OUT: span S s (R req/s), mean prompt P, mean output O tokens[; dropped]`."""
    requests = trace.requests
    arrivals = requests["arrival_s"]
    span_s = float(arrivals[-1] - arrivals[0])
    rate = "all at once"
    if span_s > 0:  # three decimals, or three significant digits below 0.1 (two requests an hour apart are not 0.000)
        # and from 1e6 up: --qps 1e308 printed a rate of 308 digits, and a span of 1e-320 s one of 'inf'
        rate_per_s = (len(trace) - 1) / span_s
        rate = f"{rate_per_s:.3f} req/s" if 0.1 <= rate_per_s < 1e6 else f"{rate_per_s:.3g} req/s"
        if math.isinf(rate_per_s):
            rate = "a rate beyond 1e308 req/s"
    parts = [
        # a newline in the path (-o) printed the line over two
        f"wrote {counted(len(trace), 'request')} to {escape_controls(destination)}: "
        f"span {shown_span(span_s)} s ({rate})",
        f"mean prompt {requests['prompt_tokens'].mean():.1f} tokens",
        f"mean output {requests['output_tokens'].mean():.1f} tokens",
    ]
    if "session_id" in requests.columns:
        # A null session id is a request of its own (BurstGPT's API calls), as analysis.capacity reads it; n_unique
        # counted all of them as one session.
        sessions = requests["session_id"]
        parts.append(counted(sessions.drop_nulls().n_unique() + sessions.null_count(), "session"))
    if dropped:
        parts.append(dropped)
    return ", ".join(parts)
