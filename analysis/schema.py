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
FINISH_REASONS: tuple[str, ...] = tuple(r.value for r in FinishReason)

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


# Counts no request can have below zero; a negative one came from a hand-edited or corrupt table.
_COUNT_COLUMNS = ("prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions")
# (earlier, later, what the pair means): event times that no run records in the other order.
_ORDERED_TIMES = (("arrival_s", "finish_s", "a request finishes after it arrives"),
                  ("first_token_s", "finish_s", "a request's first token comes no later than its finish"))


def _first(mask: pl.Series) -> int | None:
    """The first row where ``mask`` is true, or None."""
    rows = mask.fill_null(False).arg_true()
    return int(rows[0]) if len(rows) else None


def _fail(name: str, column: str, row: int, value: object, expected: str) -> None:
    shown = "null" if value is None else f"{value:g}" if isinstance(value, float) else f"{value!r}"
    raise ValueError(f"{name} table: column {column!r} is {shown} at row {row}; expected {expected}")


def check_requests(frame: pl.DataFrame) -> None:
    """Raise ValueError naming the column and first row of a conformed request table that no run can record:
    a missing or repeated request id, a negative count, an unknown finish reason, a finish before the arrival or
    a first token after the finish. Metrics computed from such rows would be silently wrong."""
    columns = set(frame.columns)
    if "request_id" in columns:
        ids = frame["request_id"]
        row = _first(ids.is_null())
        if row is not None:
            _fail("requests", "request_id", row, None, "an id on every request")
        first = _first(ids.is_duplicated())
        if first is not None:
            again = int((ids == ids[first]).arg_true()[1])
            _fail("requests", "request_id", again, ids[first], f"one row per request (it is also at row {first})")
    for column in _COUNT_COLUMNS:
        if column in columns:
            row = _first(frame[column] < 0)
            if row is not None:
                _fail("requests", column, row, frame[column][row], "an integer >= 0")
    if "finish_reason" in columns:
        row = _first(~frame["finish_reason"].is_in(FINISH_REASONS) | frame["finish_reason"].is_null())
        if row is not None:
            _fail("requests", "finish_reason", row, frame["finish_reason"][row], f"one of {', '.join(FINISH_REASONS)}")
    for earlier, later, meaning in _ORDERED_TIMES:
        if earlier in columns and later in columns:
            row = _first(frame[later] < frame[earlier])
            if row is not None:
                _fail("requests", later, row, frame[later][row], f"a time >= {earlier} ({frame[earlier][row]:g}): "
                      f"{meaning}")


def check_steps(frame: pl.DataFrame) -> None:
    """Raise ValueError naming the column and first row of a conformed step table with a step that took less
    than no time (``conform`` refuses NaN and unbounded times)."""
    if "duration_s" in frame.columns:
        row = _first(frame["duration_s"] < 0)
        if row is not None:
            _fail("steps", "duration_s", row, frame["duration_s"][row], "a duration >= 0 seconds")

