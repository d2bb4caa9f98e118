"""Azure LLM inference traces (Patel et al., Splitwise, ISCA 2024; AzurePublicDataset).

Columns `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`. The 2023 files write times as
`2023-11-16 18:15:46.6805900` (7 fractional digits, no zone); the 2024 files as
`2024-05-10 00:00:00.009930+00:00`. Arrival = time - earliest time kept, at nanosecond
resolution, after a stable sort by time. Requests with 0 context or 0 generated tokens
are dropped and counted. request_id is the 0-based data row in the CSV.

The multimodal trace of 2025 (AzureLMMInferenceTrace_multimodal.csv.gz, gzip'd) writes
times as `2024-10-15T12:00:00.269Z` and adds `NumImages` before the token counts; it is
kept as `num_images`, since images cost prefill that ContextTokens may not count.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from traces.errors import TraceError
from traces.formats.base import Converted, ConvertOptions, drop_zero_lengths, row_ids, time_origin
from traces.formats.tabular import field_shown, int_column, line_of_row, read_csv_text

# An offset of hours alone ("+00") too: PostgreSQL writes a timestamptz so, and such a re-export was read as
# zoneless and refused with the 2023 example.
_ZONE_SUFFIX = re.compile(r"(Z|[+-]\d\d(:?\d\d)?)$")
REQUIRED_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
IMAGES_COLUMN = "NumImages"  # the 2025 multimodal trace only


def parse_timestamps(path: Path, text: pl.Series) -> pl.Series:
    """Wall-clock strings to datetime[ns] (UTC when the file gives zones)."""
    first = text.drop_nulls().head(1)
    zoned = len(first) > 0 and bool(_ZONE_SUFFIX.search(first[0]))
    fmt = "%Y-%m-%d %H:%M:%S%.f%#z" if zoned else "%Y-%m-%d %H:%M:%S%.f"
    normalised = text.str.replace("T", " ", literal=True)
    if zoned:
        normalised = normalised.str.replace(r"Z$", "+00:00")
    parsed = normalised.str.to_datetime(fmt, strict=False, time_unit="ns")
    example = "2024-05-10 00:00:00.009930+00:00" if zoned else "2023-11-16 18:15:46.6805900"
    bad = parsed.is_null().arg_true()
    if len(bad):
        row = int(bad[0])
        raise TraceError(f"{path}: line {line_of_row(path, row)}: field 'TIMESTAMP' is {field_shown(text[row])}; "
                         f"expected a time like {example!r}")
    # Nanoseconds in int64 span the years 1677 to 2262; polars wraps a time outside them around silently.
    coarse = normalised.str.to_datetime(fmt, strict=False, time_unit="us")
    wrapped = (parsed.cast(pl.Int64) // 1000 - coarse.cast(pl.Int64)).abs() > 1
    outside = wrapped.arg_true()
    if len(outside):
        row = int(outside[0])
        raise TraceError(
            f"{path}: line {line_of_row(path, row)}: field 'TIMESTAMP' is {field_shown(text[row])}, outside the years "
            f"1678 to 2261; expected a time like {example!r}"
        )
    return parsed


# Arrivals are taken as nanoseconds after the earliest time, in int64: a span past 2**63 ns (292 years) wrapped
# around to a negative arrival, refused as the converted row's "arrival_s is negative".
MAX_SPAN_S = (2**63 - 1) // 10**9


def _check_span(path: Path, requests: pl.DataFrame) -> None:
    """TraceError, naming the line of the latest time, for a trace spanning more than MAX_SPAN_S."""
    seconds = requests["time"].dt.epoch("s")  # whole seconds since 1970: no overflow within 1678-2261
    if seconds[-1] - seconds[0] > MAX_SPAN_S:
        first, last = requests["time"][0], requests["time"][-1]
        raise TraceError(
            f"{path}: line {line_of_row(path, int(requests['request_id'][-1]))}: field 'TIMESTAMP' is {last}, "
            f"{(seconds[-1] - seconds[0]) / 31_557_600:.0f} years after the earliest ({first}); expected a trace "
            f"spanning at most {MAX_SPAN_S / 31_557_600:.0f} years"
        )


def read(path: Path, options: ConvertOptions) -> Converted:
    frame = read_csv_text(path, REQUIRED_COLUMNS, (IMAGES_COLUMN,))
    timestamps = parse_timestamps(path, frame["TIMESTAMP"])
    columns = {
        "request_id": row_ids(frame.height),
        "time": timestamps,
        "prompt_tokens": int_column(path, frame, "ContextTokens"),
        "output_tokens": int_column(path, frame, "GeneratedTokens"),
    }
    if IMAGES_COLUMN in frame.columns:
        columns["num_images"] = int_column(path, frame, IMAGES_COLUMN)
    requests = pl.DataFrame(columns).sort("time", maintain_order=True)
    _check_span(path, requests)
    # Nanoseconds since 1970 (a Python datetime would drop the 100 ns digit; _check_span keeps their differences within
    # int64), divided in numpy, which rounds correctly: polars multiplies by 1e-9, which gave 1.0000000000000001e-07 s
    # for 100 ns and 0.052000000000000005 for 52 ms.
    times_ns = requests["time"].dt.epoch("ns").to_numpy()
    origin_ns = time_origin(times_ns, requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy())
    requests = requests.with_columns(arrival_s=pl.Series((times_ns - origin_ns) / 1e9)).select(
        "request_id", "arrival_s", "prompt_tokens", "output_tokens",
        pl.exclude("request_id", "arrival_s", "prompt_tokens", "output_tokens", "time"))
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "request{s}")
    return Converted(requests, kept_before_drops=kept_before_drops, drop_note=drop_note)
