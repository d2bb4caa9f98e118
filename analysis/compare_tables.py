"""Text, Markdown and HTML renderings of the sim-vs-real error table.

One cell formatter feeds all three, so the terminal, a pasted README table and
the HTML report always show the same numbers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from analysis.compare_metrics import MetricRow

NOT_AVAILABLE = "n/a"
MISSING = "-"
HEADERS: tuple[str, ...] = ("metric", "real", "sim", "diff", "rel. error")
SIGNIFICANT_DIGITS = 4
_MAX_DECIMALS = 9


def format_float(value: float, sign: bool = False) -> str:
    """`value` with 4 significant digits in fixed notation (13690, 5.360, 0.2616): no "1.369e+04" in tables.

    Exact zero prints as "0" so identical runs read cleanly; magnitudes too
    large or small for fixed notation fall back to scientific.
    """
    plus = "+" if sign else ""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = SIGNIFICANT_DIGITS - 1 - magnitude
    if decimals > _MAX_DECIMALS or magnitude >= 12:
        return f"{value:{plus}.{SIGNIFICANT_DIGITS}g}"
    return f"{value:{plus}.{max(0, decimals)}f}"


def format_fixed_width(lines: Sequence[Sequence[str]], num_left: int = 1) -> str:
    """Rows of cells as aligned text: the first `num_left` columns left-aligned, the rest right-aligned."""
    widths = [max(len(line[index]) for line in lines) for index in range(len(lines[0]))]
    out = []
    for line in lines:
        cells = [
            f"{cell:<{width}}" if index < num_left else f"{cell:>{width}}"
            for index, (cell, width) in enumerate(zip(line, widths))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def _format_value(value: float | int | None, kind: str) -> str:
    if value is None:
        return MISSING
    if kind == "fraction":
        return f"{float(value) * 100:.2f} %"
    if kind == "count" or (isinstance(value, int) and not isinstance(value, bool)):
        return f"{int(value):d}"
    return format_float(float(value))


def _format_diff(value: float | int | None, kind: str) -> str:
    if value is None:
        return MISSING
    if kind == "fraction":
        return f"{float(value) * 100:+.2f} pp"  # percentage points: a difference of two shares
    if value == 0:
        return "0"
    if kind == "count" or isinstance(value, int):
        return f"{int(value):+d}"
    return format_float(float(value), sign=True)


def format_rel_error(value: float | None) -> str:
    """A signed relative error as a percentage ("+10.00 %"), or "n/a" when undefined."""
    return NOT_AVAILABLE if value is None else f"{value * 100:+.2f} %"


def row_cells(row: MetricRow) -> tuple[str, str, str, str, str]:
    """The five formatted cells of one row, in `HEADERS` order."""
    return (
        row.title,
        _format_value(row.real, row.kind),
        _format_value(row.sim, row.kind),
        _format_diff(row.diff, row.kind),
        format_rel_error(row.rel_error),
    )


def format_error_table(rows: Sequence[MetricRow]) -> str:
    """A fixed-width text table for terminals: metric left-aligned, numbers right-aligned."""
    return format_fixed_width([HEADERS, *(row_cells(row) for row in rows)])


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def error_table_markdown(rows: Sequence[MetricRow], real_name: str = "real", sim_name: str = "sim") -> str:
    """A GitHub-flavoured Markdown table (numbers right-aligned), ready to paste into a README."""
    headers = ("metric", f"real ({real_name})", f"sim ({sim_name})", "diff (sim - real)", "rel. error")
    lines = [
        "| " + " | ".join(_markdown_cell(header) for header in headers) + " |",
        "|:---|" + "---:|" * (len(headers) - 1),
    ]
    for row in rows:
        lines.append("| " + " | ".join(_markdown_cell(cell) for cell in row_cells(row)) + " |")
    return "\n".join(lines) + "\n"


def error_table_html(rows: Sequence[MetricRow]) -> str:
    """The error table as an HTML table in the report's `summary` style."""
    head = "".join(f"<th>{html.escape(header)}</th>" for header in HEADERS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row_cells(row)) + "</tr>" for row in rows
    )
    return f'<table class="summary"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
