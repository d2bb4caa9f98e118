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
from sim.batch_features import repeated_step
from traces.validation import MAX_RUN_TIME_S

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


MAX_TIME_S = MAX_RUN_TIME_S  # a run's times from its start (traces.validation)


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
        _check_cast_source(frame[column], schema[column], name)
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


def _check_cast_source(series: pl.Series, target: pl.DataType, name: str) -> None:
    """Refuse a column whose cast to ``target`` would invent numbers: polars casts true to 1, the text "12" to 12
    and 2.7 tokens to 2 without a word, so a table with counts as booleans, times as text or fractional token
    counts was summarized as if a run had written it."""
    source, shown_source, shown_target = series.dtype, series.dtype, target  # named as conform's own cast error
    if isinstance(target, pl.List) and isinstance(source, pl.List):  # token times: the same for their items
        source, target = source.inner, target.inner
    if not target.is_numeric():
        return
    # A Duration or Datetime casts to its count of micro- (or nano-) seconds: times a million-fold, summarized as s.
    if source == pl.Boolean or source in (pl.Utf8, pl.Categorical) or source.is_temporal():
        raise ValueError(f"{name} table: column {series.name!r} holds {shown_source} values that do not convert to "
                         f"{shown_target}")
    if target.is_integer() and source.is_float():
        fractional = (series.is_not_nan() & (series != series.floor())).fill_null(False)
        if fractional.any():
            row = int(fractional.arg_true()[0])
            raise ValueError(f"{name} table: column {series.name!r} is {series[row]:g} at row {row}; expected a "
                             "whole number")


def conform_requests(requests: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-request table."""
    return conform(requests, REQUESTS_SCHEMA, "requests", columns)


def conform_steps(steps: pl.DataFrame | None, columns: Iterable[str] | None = None) -> pl.DataFrame:
    """`conform` for the per-step table."""
    return conform(steps, STEPS_SCHEMA, "steps", columns)


# Counts no request can have below zero; a negative one came from a hand-edited or corrupt table.
_COUNT_COLUMNS = ("prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions")
_KNOWN_COUNT_COLUMNS = ("prompt_tokens", "output_tokens")
# The most tokens an admitted request can count (a rejected one records the prompt it was refused for, however
# long): far above any model's context, and small enough that a run's totals stay within int64 (two output counts
# of 2**62 summed to a negative total, written as the run's output throughput).
MAX_TOKENS = 2**40
# (earlier, later, what the pair means): event times that no run records in the other order.
_ORDERED_TIMES = (("arrival_s", "finish_s", "a request finishes after it arrives"),
                  ("first_token_s", "finish_s", "a request's first token comes no later than its finish"),
                  ("arrival_s", "first_scheduled_s", "a request is scheduled no earlier than it arrives"),
                  ("arrival_s", "first_token_s", "a request's first token comes no earlier than its arrival"),
                  ("first_scheduled_s", "first_token_s", "a request's first token comes no earlier than its first "
                   "step"))


def _first(mask: pl.Series) -> int | None:
    """The first row where ``mask`` is true, or None."""
    rows = mask.fill_null(False).arg_true()
    return int(rows[0]) if len(rows) else None


def _fail(name: str, column: str, row: int, value: object, expected: str) -> None:
    shown = "null" if value is None else f"{value:g}" if isinstance(value, float) else f"{value!r}"
    raise ValueError(f"{name} table: column {column!r} is {shown} at row {row}; expected {expected}")


def check_requests(frame: pl.DataFrame) -> None:
    """Raise ValueError naming the column and first row of a conformed request table that no run can record:
    a missing or repeated request id, a negative count (or one past MAX_TOKENS), an unknown finish reason, event
    times out of order (arrival, first step, first token, finish) or token times that are not finite, in order,
    from the arrival to the finish and at most one per output token. Metrics computed from such rows would be
    silently wrong."""
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
    if "replica" in columns:  # the replica that served it, an index (a rejected request's is 0, not -1)
        row = _first(frame["replica"] < 0)
        if row is not None:
            _fail("requests", "replica", row, frame["replica"][row], "an integer >= 0")
    admitted = (frame["finish_reason"] != REJECTED if "finish_reason" in columns
                else pl.Series([True] * frame.height, dtype=pl.Boolean))
    for column in _COUNT_COLUMNS:
        if column in columns:
            # Every run knows each request's prompt and output lengths (cached tokens and preemptions a served
            # run may not): a null one was summed as 0, the totals and output throughput silently short.
            row = _first(frame[column].is_null()) if column in _KNOWN_COUNT_COLUMNS else None
            if row is not None:
                _fail("requests", column, row, None, "an integer >= 0")
            row = _first(frame[column] < 0)
            if row is not None:
                _fail("requests", column, row, frame[column][row], "an integer >= 0")
            row = _first((frame[column] > MAX_TOKENS) & admitted)
            if row is not None:
                _fail("requests", column, row, frame[column][row], f"at most 2**40 ({MAX_TOKENS:,}) for a request "
                      "that was not rejected")
    _check_cached_tokens(frame)
    if "finish_reason" in columns:
        row = _first(~frame["finish_reason"].is_in(FINISH_REASONS) | frame["finish_reason"].is_null())
        if row is not None:
            _fail("requests", "finish_reason", row, frame["finish_reason"][row], f"one of {', '.join(FINISH_REASONS)}")
    if "arrival_s" in columns:  # a null arrival made the makespan 0 s and every latency n/a, summarized as measured
        row = _first(frame["arrival_s"].is_null())
        if row is not None:
            _fail("requests", "arrival_s", row, None, "a time: every request arrives")
    if {"finish_reason", "finish_s"} <= columns:  # a served request without a finish silently left E2E's samples
        row = _first(frame["finish_reason"].is_in(SERVED_FINISH_REASONS) & frame["finish_s"].is_null())
        if row is not None:
            _fail("requests", "finish_s", row, None, f"a time: the request finished ({frame['finish_reason'][row]})")
    if {"finish_reason", "output_tokens", "first_token_s"} <= columns:
        # A request served to its end with tokens out has a first token: without it TTFT and TPOT were silently n/a.
        served = frame["finish_reason"].is_in(SERVED_FINISH_REASONS) & (frame["output_tokens"] > 0)
        row = _first(served & frame["first_token_s"].is_null())
        if row is not None:
            _fail("requests", "first_token_s", row, None, f"a time: the request finished "
                  f"({frame['finish_reason'][row]}) with {frame['output_tokens'][row]} output tokens")
    for earlier, later, meaning in _ORDERED_TIMES:
        if earlier in columns and later in columns:
            row = _first(frame[later] < frame[earlier])
            if row is not None:
                _fail("requests", later, row, frame[later][row], f"a time >= {earlier} ({frame[earlier][row]:g}): "
                      f"{meaning}")
    if "token_times_s" in columns:
        _check_token_times(frame)


def _check_token_times(frame: pl.DataFrame) -> None:
    """Each request's token times: finite, within MAX_TIME_S, in order, none before the arrival nor after the
    finish, and no more of them than output tokens. ``conform`` bounds the scalar time columns only: a NaN, 1e300
    or a time before the previous one passed into the ITLs (a negative gap, a mean of 1e299 ms, an overflow
    warning) and the makespan; a last token after the finish or more token times than tokens (an impossible vLLM
    result file) into the ITLs and the makespan as if measured."""
    times = frame["token_times_s"]
    item = pl.element()
    bad = times.list.eval(item.is_null() | ~item.is_finite() | (item.abs() > MAX_TIME_S)).list.any()
    row = _first(bad)
    if row is not None:
        value = next(v for v in times[row] if v is None or not abs(v) <= MAX_TIME_S)
        _fail("requests", "token_times_s", row, value, f"finite times within {MAX_TIME_S:g} seconds of the run's "
              "start")
    # Cast: over a column whose rows are all null (no token times recorded, as a null row alone is read) polars
    # gives the differences' minimum the Null type, which has no '<' (a NotImplementedError traceback).
    row = _first(times.list.diff().list.min().cast(pl.Float64) < 0)
    if row is not None:
        values = times[row].to_list()
        index = next(i for i in range(1, len(values)) if values[i] < values[i - 1])
        _fail("requests", "token_times_s", row, values[index], f"times in order (item {index} is before item "
              f"{index - 1}, {values[index - 1]:g})")
    if "arrival_s" in frame.columns:
        row = _first(times.list.first() < frame["arrival_s"])
        if row is not None:
            _fail("requests", "token_times_s", row, times[row][0], f"a first token time >= arrival_s "
                  f"({frame['arrival_s'][row]:g}): a request's tokens come after it arrives")
    if "finish_s" in frame.columns:  # its tokens were counted into a latency that ended before them
        row = _first(times.list.last() > frame["finish_s"])
        if row is not None:
            _fail("requests", "token_times_s", row, times[row][-1], f"a last token time <= finish_s "
                  f"({frame['finish_s'][row]:g}): a request's tokens come no later than its finish")
    if "output_tokens" in frame.columns:  # one time per token, or fewer where a streamed chunk carried several
        row = _first(times.list.len() > frame["output_tokens"])
        if row is not None:
            raise ValueError(f"requests table: column 'token_times_s' holds {len(times[row])} times at row {row}; "
                             f"expected at most output_tokens ({frame['output_tokens'][row]}): one time per output "
                             "token (a streamed chunk of several counts once)")


def _check_cached_tokens(frame: pl.DataFrame) -> None:
    """Raise ValueError naming the first row with more cached than prompt tokens: the cache holds prompt blocks, and
    such rows were summarized as a prefix-cache hit rate above 100 %."""
    if {"cached_tokens", "prompt_tokens"} <= set(frame.columns):
        row = _first(frame["cached_tokens"] > frame["prompt_tokens"])
        if row is not None:
            _fail("requests", "cached_tokens", row, frame["cached_tokens"][row], f"at most prompt_tokens "
                  f"({frame['prompt_tokens'][row]}): a cached token is a prompt token")


def check_steps(frame: pl.DataFrame) -> None:
    """Raise ValueError naming the column and first row of a conformed step table with a step that took less
    than no time (``conform`` refuses NaN and unbounded times), a negative id or count, or a KV usage outside 0-1."""
    if "duration_s" in frame.columns:
        row = _first(frame["duration_s"] < 0)
        if row is not None:
            _fail("steps", "duration_s", row, frame["duration_s"][row], "a duration >= 0 seconds")
    for column in STEPS_SCHEMA:  # an engine writes every value of a step: a null kv_usage was a mean KV usage of 0
        if column in frame.columns:
            row = _first(frame[column].is_null())
            if row is not None:
                _fail("steps", column, row, None, "a value in every step")
    if {"replica", "step"} <= set(frame.columns):  # a step given twice was counted twice (compare refused it)
        found = repeated_step(frame)
        if found is not None:
            later, replica, step, first = found
            _fail("steps", "step", later, step, f"one row per step of a replica (replica {replica}, step {step} is "
                  f"also at row {first})")
    for column, dtype in STEPS_SCHEMA.items():  # ids and counts: a negative step or batch is no step a run took
        if dtype == pl.Int64 and column in frame.columns:
            row = _first(frame[column] < 0)
            if row is not None:
                _fail("steps", column, row, frame[column][row], "an integer >= 0")
    if "kv_usage" in frame.columns:  # used / total blocks; NaN (polars orders it above every number) is caught too
        row = _first((frame["kv_usage"] < 0) | (frame["kv_usage"] > 1))
        if row is not None:
            _fail("steps", "kv_usage", row, frame["kv_usage"][row], "a share of the KV cache from 0 to 1")

