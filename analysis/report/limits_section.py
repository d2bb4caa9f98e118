"""The report's section on how far to trust a simulated run: its warnings (``sim.limits``) and its prediction
bands (``analysis.bands``). Empty for a run that has neither (a GPU run, or a simulation without any)."""

from __future__ import annotations

from collections.abc import Mapping

from analysis.band_stats import flat_bands
from analysis.formatting import format_float
from analysis.report.html_page import html_text, table_html


def limits_section_html(summary: Mapping) -> str:
    parts = []
    warnings = summary.get("warnings") or []
    if warnings:
        parts.append(table_html([(w.get("code", ""), w.get("message", "")) for w in warnings], ["warning", "what"],
                                caption="where this run leaves what the simulator was measured on"))
    bands = summary.get("bands")
    if isinstance(bands, Mapping) and isinstance(bands.get("metrics"), Mapping):
        rows = [(key, *(format_float(float(band[stat])) for stat in ("p5", "median", "p95")))
                for key, band in flat_bands(summary).items()]
        varied = "; ".join(f"{what}: {how}" for what, how in (bands.get("varied") or {}).items())
        parts.append(table_html(rows, ["metric", "p5", "median", "p95"],
                                caption=f"prediction bands over {bands.get('num_replays')} seeded replays"))
        parts.append(f'<p class="subtitle">varied: {html_text(varied)}</p>')
    return "\n".join(parts)
