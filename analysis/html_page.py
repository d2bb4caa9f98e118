"""Self-contained HTML pages of plotly figures (works offline, e.g. opened from a cluster).

plotly.js is inlined once in <head>; each figure is embedded as a div without
its own copy, so a page with many charts costs one bundle (~5 MB), not many.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from analysis.summary_table import LATENCY_ROWS, STAT_NAMES, format_number, format_percent

PAGE_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 1rem 2rem; color: #222; }
h1 { margin-bottom: 0.2rem; }
.subtitle { color: #555; margin-top: 0; }
table.summary { border-collapse: collapse; margin: 0.5rem 2rem 1rem 0; display: inline-table; vertical-align: top; }
table.summary th, table.summary td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
table.summary th:first-child, table.summary td:first-child { text-align: left; }
table.summary thead th { background: #f3f3f3; }
.figure { margin: 1.5rem 0; }
"""

_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _figure_div(fig: go.Figure) -> str:
    height = fig.layout.height
    return fig.to_html(
        full_html=False,
        include_plotlyjs=False,
        config=_PLOT_CONFIG,
        default_width="100%",
        default_height=f"{int(height)}px" if height else "500px",
    )


def write_html(
    figures: Sequence[go.Figure],
    path: str | Path,
    title: str,
    header_html: str = "",
) -> Path:
    """Write `figures` below a title and `header_html` (trusted HTML) to one offline page.

    Creates parent directories; returns the path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    divs = "\n".join(f'<div class="figure">{_figure_div(fig)}</div>' for fig in figures)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{PAGE_STYLE}</style>\n"
        f'<script type="text/javascript">{get_plotlyjs()}</script>\n</head>\n<body>\n'
        f"<header>\n<h1>{html.escape(title)}</h1>\n{header_html}\n</header>\n"
        f"<main>\n{divs}\n</main>\n</body>\n</html>\n"
    )
    path.write_text(page, encoding="utf-8")
    return path


def key_value_table_html(rows: Sequence[tuple[str, str]], caption: str | None = None) -> str:
    """A two-column HTML table of already formatted (label, value) pairs."""
    body = "".join(f"<tr><td>{html.escape(label)}</td><td>{html.escape(value)}</td></tr>" for label, value in rows)
    head = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<table class="summary">{head}<tbody>{body}</tbody></table>'


def latency_table_html(summaries: Mapping[str, Mapping]) -> str:
    """Latency percentiles (ms) of one or more summaries, one column group per run."""
    runs = list(summaries)
    group = len(runs) > 1
    header_cells = "".join(
        f"<th>{html.escape(f'{run} {stat}' if group else stat)}</th>" for run in runs for stat in STAT_NAMES
    )
    rows = []
    for label, key in LATENCY_ROWS:
        cells = "".join(
            f"<td>{format_number((summaries[run].get(key) or {}).get(stat))}</td>"
            for run in runs
            for stat in STAT_NAMES
        )
        rows.append(f"<tr><td>{html.escape(label)}</td>{cells}</tr>")
    return (
        f'<table class="summary"><thead><tr><th>latency (ms)</th>{header_cells}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def summary_rows(summary: Mapping) -> list[tuple[str, str]]:
    """Formatted (label, value) pairs of a summary's non-latency headline numbers."""
    rows = [
        ("requests", format_number(summary.get("num_requests"), "d")),
        ("finished", format_number(summary.get("num_finished"), "d")),
        ("rejected", format_number(summary.get("num_rejected"), "d")),
        ("aborted", format_number(summary.get("num_aborted"), "d")),
        ("duration", format_number(summary.get("duration_s"), ".2f", " s")),
        ("request throughput", format_number(summary.get("request_throughput"), ".3f", " req/s")),
        ("output throughput", format_number(summary.get("output_throughput"), ".1f", " tok/s")),
    ]
    if "goodput" in summary:
        rows.append(("goodput", format_number(summary.get("goodput"), ".3f", " req/s")))
    rows += [
        ("prompt tokens", format_number(summary.get("total_prompt_tokens"), ",d")),
        ("output tokens", format_number(summary.get("total_output_tokens"), ",d")),
        ("preemptions", format_number(summary.get("num_preemptions"), "d")),
        ("prefix cache hit rate", format_percent(summary.get("prefix_cache_hit_rate"))),
        ("peak KV usage", format_percent(summary.get("peak_kv_usage"))),
        ("mean KV usage", format_percent(summary.get("mean_kv_usage"))),
        ("engine steps", format_number(summary.get("num_steps"), ",d")),
    ]
    return rows


def summary_table_html(summary: Mapping) -> str:
    """The headline numbers and latency percentiles of one summary as HTML tables."""
    return key_value_table_html(summary_rows(summary)) + latency_table_html({"": summary})
