"""Column schemas of the two replay tables (`requests`, `steps`).

Simulated and GPU replays both write these tables; checking and casting them in
one place lets every metric assume the documented dtypes (and lets an empty or
all-null column built from Python lists still do arithmetic).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import polars as pl

from engine.core.records import SCHEDULE_COLUMNS

FINISHED_REASONS: tuple[str, ...] = ("stop", "length")
REJECTED = "rejected"
ABORTED = "aborted"

REQUESTS_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Utf8(),
    "replica": pl.Int64(),
    "arrival_s": pl.Float64(),
    "first_scheduled_s": pl.Float64(),
    "first_token_s": pl.Float64(),
    "finish_s": pl.Float64(),
    "prompt_tokens": pl.Int64(),
    "output_tokens": pl.Int64(),
    "cached_tokens": pl.Int64(),
    "num_preemptions": pl.Int64(),
    "finish_reason": pl.Utf8(),
    "reject_reason": pl.Utf8(),
    "token_times_s": pl.List(pl.Float64()),
}

# Required step columns; COST_COLUMNS (newer) are optional, so runs recorded before them still load.
_STEP_INT_COLUMNS = ("replica", "step", *SCHEDULE_COLUMNS)

STEPS_SCHEMA: dict[str, pl.DataType] = {
    **{name: pl.Int64() for name in _STEP_INT_COLUMNS},
    "start_s": pl.Float64(),
    "duration_s": pl.Float64(),
    "kv_usage": pl.Float64(),
}


def empty_frame(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """A zero-row frame with `schema`, for runs that produced nothing."""
    return pl.DataFrame(schema=dict(schema))


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
    casts = [
        pl.col(column).cast(schema[column])
        for column in needed
        if frame.schema[column] != schema[column]
    ]
    return frame.with_columns(casts) if casts else frame


def conform_requests(requests: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-request table."""
    return conform(requests, REQUESTS_SCHEMA, "requests", columns)


def conform_steps(steps: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-step table."""
    return conform(steps, STEPS_SCHEMA, "steps", columns)
