"""One-line summaries of a trace, printed by the CLIs so a run shows what it wrote."""

from __future__ import annotations

from traces.schema import Trace


def describe(trace: Trace, destination: str, dropped: str = "") -> str:
    """`wrote N requests to OUT: span S s (R req/s), mean prompt P, mean output O tokens[; dropped]`."""
    requests = trace.requests
    arrivals = requests["arrival_s"]
    span_s = float(arrivals[-1] - arrivals[0])
    rate = "all at once"
    if span_s > 0:  # three decimals, or three significant digits below 0.1 (two requests an hour apart are not 0.000)
        rate_per_s = (len(trace) - 1) / span_s
        rate = f"{rate_per_s:.3f} req/s" if rate_per_s >= 0.1 else f"{rate_per_s:.3g} req/s"
    parts = [
        f"wrote {len(trace)} requests to {destination}: span {span_s:.3f} s ({rate})",
        f"mean prompt {requests['prompt_tokens'].mean():.1f} tokens",
        f"mean output {requests['output_tokens'].mean():.1f} tokens",
    ]
    if "session_id" in requests.columns:
        parts.append(f"{requests['session_id'].n_unique()} sessions")
    if dropped:
        parts.append(dropped)
    return ", ".join(parts)
