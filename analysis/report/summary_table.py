"""A `summarize()` dict's headline numbers: a fixed-width text table for CLIs to print, and HTML
tables for reports, formatted alike.

Missing keys and None values print as "-" (see `analysis.formatting`).
"""

from __future__ import annotations

from collections.abc import Mapping

from analysis.formatting import LATENCY_LABELS, format_number, format_percent
from analysis.report.html_page import table_html
from analysis.schema import CUT_REASONS
from analysis.stats import STATISTIC_NAMES

# summary key -> (format spec, unit suffix); keys not listed are 0..1 fractions shown as percentages.
_FORMATS: dict[str, tuple[str, str]] = {
    "num_requests": ("d", ""),
    "num_finished": ("d", ""),
    "num_rejected": ("d", ""),
    "num_aborted": ("d", ""),
    "num_failed": ("d", ""),
    "num_cut": ("d", ""),
    "duration_s": (".2f", " s"),
    "request_throughput": (".3f", " req/s"),
    "output_throughput": (".1f", " tok/s"),
    "total_token_throughput": (".1f", " tok/s"),
    "max_output_tokens_per_s": (".0f", " tok/s"),
    "max_concurrent_requests": ("d", ""),
    "goodput": (".3f", " req/s"),
    "total_prompt_tokens": (",d", ""),
    "total_output_tokens": (",d", ""),
    "num_preemptions": ("d", ""),
    "num_steps": (",d", ""),
}
# summary key -> its row label in the HTML table, in row order (goodput only when the summary has one).
_HTML_LABELS: dict[str, str] = {
    "num_requests": "requests", "num_finished": "finished", "num_cut": "finished but cut by a limit",
    "num_rejected": "rejected", "num_aborted": "aborted", "num_failed": "failed",
    "duration_s": "duration", "request_throughput": "request throughput", "output_throughput": "output throughput",
    "total_token_throughput": "total token throughput", "max_output_tokens_per_s": "peak output throughput",
    "max_concurrent_requests": "max concurrent requests",
    "goodput": "goodput", "total_prompt_tokens": "prompt tokens", "total_output_tokens": "output tokens",
    "num_preemptions": "preemptions", "prefix_cache_hit_rate": "prefix cache hit rate",
    "peak_kv_usage": "peak KV usage", "mean_kv_usage": "mean KV usage", "num_steps": "engine steps",
}
LABEL_WIDTH = 24
COLUMN_WIDTH = 10


def format_field(summary: Mapping, key: str) -> str:
    """One headline number of `summary`, with its unit; a number its fixed decimals would show as 0 with
    significant digits instead (a trace spanning days served 0.0002 req/s, printed as a measured 0.000 req/s)."""
    value = summary.get(key)
    if key not in _FORMATS:
        text = format_percent(value)
        return format_percent(value, ".2g") if _hides_nonzero(text, value) else text
    spec, suffix = _FORMATS[key]
    text = format_number(value, spec, suffix)
    return format_number(value, ".4g", suffix) if _hides_nonzero(text, value) else text


def _hides_nonzero(text: str, value: object) -> bool:
    """Whether ``text`` shows no nonzero digit for a nonzero float ``value``."""
    return isinstance(value, float) and value != 0 and not any(c in "123456789" for c in text)


def _latency_cell(value: object) -> str:
    """A latency in ms to two decimals, or to four significant digits when that would not leave a column's
    separating space (latencies of days ran together: 12540400000.0013878300000.00)."""
    text = format_number(value)
    return text if len(text) < COLUMN_WIDTH else format_number(value, ".4g")


def _latency_rows(summary: Mapping) -> list[list[str]]:
    """[label, p50, p90, p99, mean] (ms) per latency metric."""
    return [
        [label, *(_latency_cell((summary.get(f"{metric}_ms") or {}).get(stat)) for stat in STATISTIC_NAMES)]
        for metric, label in LATENCY_LABELS.items()
    ]


SHOWN_REASONS = 3  # the table names the commonest rejection reasons; summary.json holds them all


def _reasons_note(summary: Mapping) -> str:
    """" (why: count; ...)" for the rejections, or "": a count alone left the reader to open summary.json."""
    reasons = summary.get("reject_reasons") or {}
    if not isinstance(reasons, Mapping) or not reasons:
        return ""
    shown = [f"{reason}: {count}" for reason, count in list(reasons.items())[:SHOWN_REASONS]]
    if len(reasons) > SHOWN_REASONS:
        shown.append(f"{len(reasons) - SHOWN_REASONS} more reason(s) in summary.json")
    return f" ({'; '.join(shown)})"


def format_summary_table(summary: Mapping) -> str:
    """A short fixed-width table of a summary's headline numbers (latencies in ms)."""

    def line(label: str, text: str) -> str:
        return f"{label:<{LABEL_WIDTH}}{text}"

    finished = f"{format_field(summary, 'num_finished')} / {format_field(summary, 'num_requests')}"
    lines = [line("requests finished", finished)]
    cut = format_field(summary, "num_cut")
    reasons = summary.get("finish_reasons") or {}
    cut_by = [f"{reason} {count}" for reason, count in reasons.items() if reason in CUT_REASONS]
    lines.append(line("  cut by a limit", cut + (f" ({', '.join(cut_by)})" if cut_by else "")))
    lines.append(line("requests rejected", format_field(summary, "num_rejected") + _reasons_note(summary)))
    lines += [line(f"requests {kind}", format_field(summary, f"num_{kind}")) for kind in ("aborted", "failed")]
    lines += [
        line("duration", format_field(summary, "duration_s")),
        line("request throughput", format_field(summary, "request_throughput")),
        line("output throughput", format_field(summary, "output_throughput")),
        line("total token throughput", format_field(summary, "total_token_throughput")),
        line("peak output throughput", format_field(summary, "max_output_tokens_per_s")),
        line("max concurrent requests", format_field(summary, "max_concurrent_requests")),
    ]
    if "goodput" in summary:
        lines.append(line("goodput", format_field(summary, "goodput")))
    lines.append(line("latency (ms)", "".join(f"{name:>{COLUMN_WIDTH}}" for name in STATISTIC_NAMES)))
    for label, *cells in _latency_rows(summary):
        lines.append(line(f"  {label}", "".join(f"{cell:>{COLUMN_WIDTH}}" for cell in cells)))
    lines += [
        line("preemptions", format_field(summary, "num_preemptions")),
        line("prefix cache hit rate", format_field(summary, "prefix_cache_hit_rate")),
        line("KV usage peak / mean",
             f"{format_field(summary, 'peak_kv_usage')} / {format_field(summary, 'mean_kv_usage')}"),
    ]
    return "\n".join(lines)


def summary_table_html(summary: Mapping) -> str:
    """The headline numbers and latency percentiles of one summary as HTML tables."""
    rows = [(label, format_field(summary, key) + (_reasons_note(summary) if key == "num_rejected" else ""))
            for key, label in _HTML_LABELS.items() if key != "goodput" or key in summary]
    return table_html(rows) + table_html(_latency_rows(summary), ["latency (ms)", *STATISTIC_NAMES])
