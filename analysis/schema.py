"""Column schemas of the two replay tables (`requests`, `steps`).

Simulated and GPU replays both write these tables; checking and casting them in
one place lets every metric assume the documented dtypes (and lets an empty or
all-null column built from Python lists still do arithmetic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from engine.core.records import OPTIONAL_STEP_COLUMNS, REQUEST_COLUMNS, SERVED_FINISH_REASONS, STEP_COLUMNS
from engine.core.sequence import FinishReason

FINISHED_REASONS: tuple[str, ...] = SERVED_FINISH_REASONS
REJECTED = FinishReason.REJECTED.value
ABORTED = FinishReason.ABORTED.value
FAILED = FinishReason.ERROR.value
CUT_REASONS: tuple[str, ...] = tuple(r.value for r in FinishReason if r.is_cut)

_POLARS_TYPES: dict[str, pl.DataType] = {
    "int64": pl.Int64(),
    "float64": pl.Float64(),
    "string": pl.Utf8(),
    "list<float64>": pl.List(pl.Float64()),
}

REQUESTS_SCHEMA: dict[str, pl.DataType] = {c.name: _POLARS_TYPES[c.dtype] for c in REQUEST_COLUMNS}

# Required step columns; the optional ones (newer) may be missing, so runs recorded before them still load.
STEPS_SCHEMA: dict[str, pl.DataType] = {
    c.name: _POLARS_TYPES[c.dtype] for c in STEP_COLUMNS if c.name not in OPTIONAL_STEP_COLUMNS
}


def empty_frame(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """A zero-row frame with `schema`, for runs that produced nothing."""
    return pl.DataFrame(schema=dict(schema))


MAX_TIME_S = 1e12


def conform(
    frame: pl.DataFrame | None,
    schema: Mapping[str, pl.DataType],
    name: str,
    columns: Iterable[str] | None = None,
) -> pl.DataFrame:
    """Check `frame` has `columns` (default: all of `schema`) and cast them to `schema`.

    A missing frame or one with no columns at all counts as an empty table.
    Other columns are kept untouched so callers can carry their own data along;
    asking only for the columns a metric reads keeps small hand-made frames usable.
    """
    if frame is None or frame.width == 0:
        return empty_frame(schema)
    needed = list(schema if columns is None else columns)
    missing = [column for column in needed if column not in frame.columns]
    if missing:
        raise ValueError(f"{name} table is missing columns: {', '.join(missing)}")
    casts = []
    for column in needed:
        if frame.schema[column] == schema[column]:
            continue
        try:  # one column at a time, so the error names it in one line (polars' spans several)
            casts.append(frame[column].cast(schema[column]))
        except pl.exceptions.PolarsError:
            raise ValueError(f"{name} table: column {column!r} holds {frame.schema[column]} values that do not "
                             f"convert to {schema[column]}") from None
    frame = frame.with_columns(casts) if casts else frame
    for column in needed:  # times past ~31,700 years are not offsets; their arithmetic overflows into warnings
        if column.endswith("_s") and schema[column] == pl.Float64 and frame.height:
            beyond = frame[column].abs() > MAX_TIME_S
            if beyond.any():
                row = int(beyond.arg_true()[0])
                raise ValueError(f"{name} table: column {column!r} is {frame[column][row]:g} at row {row}; times "
                                 f"must be within {MAX_TIME_S:g} seconds of the run's start")
    return frame


def conform_requests(requests: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-request table."""
    return conform(requests, REQUESTS_SCHEMA, "requests", columns)


def conform_steps(steps: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-step table."""
    return conform(steps, STEPS_SCHEMA, "steps", columns)
