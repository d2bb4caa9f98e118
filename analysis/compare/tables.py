"""Text, Markdown and HTML renderings of the sim-vs-real error table.

One cell formatter feeds all three, so the terminal, a pasted README table and
the HTML report always show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from analysis.compare.error_table import MetricRow
from analysis.formatting import format_float, format_percent, markdown_cell
from analysis.report.html_page import table_html

NOT_AVAILABLE = "n/a"
HEADERS: tuple[str, ...] = ("metric", "real", "sim", "diff", "rel. error")


def format_fixed_width(lines: Sequence[Sequence[str]]) -> str:
    """Rows of cells as aligned text: the first column left-aligned, the rest right-aligned."""
    widths = [max(len(line[index]) for line in lines) for index in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [
            f"{cell:<{width}}" if index == 0 else f"{cell:>{width}}"
            for index, (cell, width) in enumerate(zip(line, widths))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _format_cell(value: float | int | None, kind: str, sign: bool = False) -> str:
    """A real or simulated value, or with `sign` their difference (then exact zero reads "0")."""
    plus = "+" if sign else ""
    if value is None:  # not recorded by that run (an HTTP client sees no cached tokens): n/a, never 0
        return NOT_AVAILABLE
    if kind == "fraction":  # a difference of two shares is in percentage points
        return f"{float(value) * 100:{plus}.2f} {'pp' if sign else '%'}"
    if sign and value == 0:
        return "0"
    if kind == "count" or (isinstance(value, int) and not isinstance(value, bool)):
        return f"{int(value):{plus}d}"
    return format_float(float(value), sign)


def format_rel_error(value: float | None) -> str:
    """A signed relative error as a percentage ("+10.00 %"), or "n/a" when undefined."""
    return format_percent(value, "+.2f", missing=NOT_AVAILABLE)


def row_cells(row: MetricRow) -> tuple[str, str, str, str, str]:
    """The five formatted cells of one row, in `HEADERS` order."""
    return (
        row.title,
        _format_cell(row.real, row.kind),
        _format_cell(row.sim, row.kind),
        _format_cell(row.diff, row.kind, sign=True),
        row.note or format_rel_error(row.rel_error),
    )


BAND_HEADERS: tuple[str, ...] = ("sim p5 - p95", "real in band")


def has_bands(rows: Sequence[MetricRow]) -> bool:
    """Whether the sim side ran with --bands: then the tables get `BAND_HEADERS` columns."""
    return any(row.band is not None for row in rows)


def band_cells(row: MetricRow) -> tuple[str, str]:
    """The band's p5 - p95 range and whether the real figure lies in it ("yes", "no", or n/a)."""
    if row.band is None:
        return NOT_AVAILABLE, NOT_AVAILABLE
    low, high = (_format_cell(row.band[stat], row.kind) for stat in ("p5", "p95"))
    inside = NOT_AVAILABLE if row.in_band is None else ("yes" if row.in_band else "no")
    return f"{low} - {high}", inside


def table_cells(rows: Sequence[MetricRow]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Headers and rows of cells, with the band columns when the sim side has bands."""
    if not has_bands(rows):
        return HEADERS, [row_cells(row) for row in rows]
    return (*HEADERS, *BAND_HEADERS), [(*row_cells(row), *band_cells(row)) for row in rows]


def format_error_table(rows: Sequence[MetricRow]) -> str:
    """A fixed-width text table for terminals: metric left-aligned, numbers right-aligned."""
    headers, cells = table_cells(rows)
    return format_fixed_width([headers, *cells])


def error_table_markdown(rows: Sequence[MetricRow], real_name: str = "real", sim_name: str = "sim") -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned), ready to paste into a README."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(map(markdown_cell, cells)) + " |"

    headers = ("metric", f"real ({real_name})", f"sim ({sim_name})", "diff (sim - real)", "rel. error")
    band_headers, cells = table_cells(rows)
    headers += band_headers[len(HEADERS):]
    lines = [line(headers), "|:---|" + "---:|" * (len(headers) - 1), *(line(c) for c in cells)]
    return "\n".join(lines) + "\n"


def error_table_html(rows: Sequence[MetricRow]) -> str:
    """The error table as an HTML table in the report's `summary` style."""
    headers, cells = table_cells(rows)
    return table_html(cells, headers)
