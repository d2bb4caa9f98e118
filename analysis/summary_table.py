"""Fixed-width text rendering of a `summarize()` dict, for CLIs to print.

Missing keys and None values print as "-" so partial or empty summaries
(e.g. a run where every request was rejected) still render.
"""

from __future__ import annotations

from collections.abc import Mapping

LATENCY_ROWS: tuple[tuple[str, str], ...] = (
    ("TTFT", "ttft_ms"),
    ("TPOT", "tpot_ms"),
    ("ITL", "itl_ms"),
    ("E2E", "e2e_ms"),
    ("queue", "queue_ms"),
)
STAT_NAMES: tuple[str, ...] = ("p50", "p90", "p99", "mean")
MISSING = "-"


def format_number(value: object, spec: str = ".2f", suffix: str = "") -> str:
    """`value` formatted with `spec` plus `suffix`, or "-" when it is missing."""
    if value is None or isinstance(value, (dict, list, str)):
        return MISSING
    if spec.endswith("d") and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return f"{value:{spec}}{suffix}"
    except (TypeError, ValueError):
        return f"{value}{suffix}"


def format_percent(fraction: object) -> str:
    """A 0..1 fraction as a percentage, or "-"."""
    return format_number(None if fraction is None else float(fraction) * 100, ".1f", " %")


def format_summary_table(summary: Mapping) -> str:
    """A short fixed-width table of a summary's headline numbers (latencies in ms)."""
    label_width = 24
    column_width = 10

    def line(label: str, text: str) -> str:
        return f"{label:<{label_width}}{text}"

    num_requests = summary.get("num_requests")
    finished = f"{format_number(summary.get('num_finished'), 'd')} / {format_number(num_requests, 'd')}"
    lines = [
        line("requests finished", finished),
        line("requests rejected", format_number(summary.get("num_rejected"), "d")),
        line("requests aborted", format_number(summary.get("num_aborted"), "d")),
        line("duration", format_number(summary.get("duration_s"), ".2f", " s")),
        line("request throughput", format_number(summary.get("request_throughput"), ".3f", " req/s")),
        line("output throughput", format_number(summary.get("output_throughput"), ".1f", " tok/s")),
    ]
    if "goodput" in summary:
        lines.append(line("goodput", format_number(summary.get("goodput"), ".3f", " req/s")))
    header = "".join(f"{name:>{column_width}}" for name in STAT_NAMES)
    lines.append(line("latency (ms)", header))
    for label, key in LATENCY_ROWS:
        stats = summary.get(key) or {}
        cells = "".join(f"{format_number(stats.get(name)):>{column_width}}" for name in STAT_NAMES)
        lines.append(line(f"  {label}", cells))
    lines += [
        line("preemptions", format_number(summary.get("num_preemptions"), "d")),
        line("prefix cache hit rate", format_percent(summary.get("prefix_cache_hit_rate"))),
        line("KV usage peak / mean", f"{format_percent(summary.get('peak_kv_usage'))} / "
             f"{format_percent(summary.get('mean_kv_usage'))}"),
    ]
    return "\n".join(lines)
