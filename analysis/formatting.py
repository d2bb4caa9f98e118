"""How every tool names latency metrics and prints numbers, so a summary, a comparison and a
capacity report show a metric under one name and a number in one way.

Missing values (None, or a nested dict or list where a number was expected) print as "-", so
partial or empty summaries (e.g. a run where every request was rejected) still render.
"""

from __future__ import annotations

import math
import re

from engine.core.messages import escape_controls

# Latency metric -> its label in tables and charts, in the order they list metrics. The key is the
# stem of a summary's `<name>_ms` entry, of an SLO (`ttft_p90`) and, for all but ITL (the pooled
# gaps between tokens), of a request's `<name>_s` column.
LATENCY_LABELS: dict[str, str] = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "queue": "queue"}
# The latencies a request's service is judged by (its queueing is part of TTFT): plotted and compared.
SERVICE_LATENCIES: tuple[str, ...] = tuple(m for m in LATENCY_LABELS if m != "queue")
MISSING = "-"
SIGNIFICANT_DIGITS = 4
_MAX_DECIMALS = 9


def format_number(value: object, spec: str = ".2f", suffix: str = "", prefix: str = "", missing: str = MISSING) -> str:
    """`prefix`, `value` formatted with `spec`, `suffix`; or `missing` when there is no number."""
    if value is None or isinstance(value, (dict, list, str)):
        return missing
    if spec.endswith("d") and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return f"{prefix}{value:{spec}}{suffix}"
    except (TypeError, ValueError):
        return f"{prefix}{value}{suffix}"


def format_percent(fraction: object, spec: str = ".1f", missing: str = MISSING) -> str:
    """A fraction (1.0 = 100 %) as a percentage, e.g. "12.5 %"; or `missing`."""
    return format_number(None if fraction is None else float(fraction) * 100, spec, " %", missing=missing)


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


def markdown_cell(text: object) -> str:
    """``text`` as a Markdown table cell: control characters escaped (a newline in a run folder's name ended the row
    mid-cell) and each ``|`` as ``\\|`` (it began another cell)."""
    return escape_controls(text).replace("|", "\\|")


def markdown_code(text: object) -> str:
    """``text`` as a Markdown code span, its control characters escaped: fenced by one backtick more than its longest
    run of them, and padded where it starts or ends with one (a backtick in a cost model's name closed the span)."""
    text = escape_controls(text)
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
