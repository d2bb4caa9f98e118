"""Check a request table against the trace schema and normalise its dtypes.

All checks are vectorised polars expressions; for each rule only the first offending
row is located (with `arg_true`) so that the error message can name it. Loading the
19k-row Azure trace therefore costs milliseconds, not a Python loop over rows.
"""

from __future__ import annotations

import polars as pl

from traces.errors import TraceError, row_error

REQUIRED_COLUMNS: tuple[str, ...] = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS: tuple[str, ...] = ("prompt_token_ids", "hash_ids", "session_id")
MAX_HASH_BLOCK_SIZE = 2**31  # tokens per hash block; larger would overflow the length check's int64 arithmetic
# Some 31,700 years: past it a trace holds timestamps, not offsets, and the rate arithmetic overflows (an arrival
# at 1e300 s ran to exit 0 with numpy overflow warnings).
MAX_ARRIVAL_S = 1e12
# A run's times (tokens, finishes, steps) from its start: the last arrival plus the run's own length. The same bound
# as the arrivals' made a valid trace whose last request arrives near it fail only after its whole replay.
MAX_RUN_TIME_S = 2 * MAX_ARRIVAL_S


def _first_true(mask: pl.Series) -> int | None:
    """Index of the first True in a boolean series (nulls count as False), or None."""
    hits = mask.fill_null(False).arg_true()
    return int(hits[0]) if len(hits) else None


def _text_of_categories(series: pl.Series) -> pl.Series:
    """A dictionary-encoded text column (parquet's usual encoding of repeated strings; polars reads it as
    Categorical) as plain text, which is what it holds."""
    return series.cast(pl.String) if isinstance(series.dtype, (pl.Categorical, pl.Enum)) else series



# What each of the trace's columns must hold, as its type errors say it (load_trace refuses a type polars cannot read
# with the same words).
EXPECTED_TYPES = {"request_id": "int64 or utf8 (string)", "arrival_s": "float64 seconds",
                  "prompt_tokens": "integers >= 1", "output_tokens": "integers >= 1",
                  "prompt_token_ids": "a list of integers (token ids >= 0)",
                  "hash_ids": "a list of integers (ids of fixed-size prompt blocks)",
                  "session_id": "int64 or utf8 (nullable)"}

class _Checker:
    """Holds the table being checked so messages can quote the request id of a row."""

    def __init__(self, df: pl.DataFrame, source: str) -> None:
        self.df = df
        self.source = source
        self.ids: pl.Series | None = None  # set once request_id is known to be valid

    def fail(self, row: int | None, column: str, problem: str) -> TraceError:
        request_id = None
        if row is not None and self.ids is not None:
            request_id = self.ids[row]
        return row_error(self.source, row, request_id, column, problem)

    def fail_at_first(self, mask: pl.Series, column: str, problem_of_row) -> None:
        """Raise for the first row where `mask` holds; `problem_of_row(row)` words it."""
        row = _first_true(mask)
        if row is not None:
            raise self.fail(row, column, problem_of_row(row))

    def check_no_nulls(self, column: str, what: str) -> None:
        series = self.df[column]
        self.fail_at_first(series.is_null(), column, lambda row: f"is null; expected {what}")

    # --- individual columns -------------------------------------------------------

    def as_int64(self, series: pl.Series, column: str, expected: str) -> pl.Series:
        """An integer column as int64; a uint64 value past int64's range is an error at its row (the cast raised)."""
        if series.dtype == pl.UInt64:
            self.fail_at_first(series > 2**63 - 1, column,
                               lambda row: f"is {series[row]}, beyond int64 (at most 2**63 - 1); expected {expected}")
        return series.cast(pl.Int64)

    def request_ids(self) -> pl.Series:
        series = _text_of_categories(self.df["request_id"])
        if series.dtype.is_integer():
            series = self.as_int64(series, "request_id", "a unique int64 or string id")
        elif series.dtype != pl.String:
            raise self.fail(None, "request_id", f"has type {series.dtype}; expected {EXPECTED_TYPES['request_id']}")
        self.check_no_nulls("request_id", "a unique int64 or string id")
        repeated = _first_true(~series.is_first_distinct())
        if repeated is not None:
            value = series[repeated]
            first = _first_true(series == value)
            raise self.fail(
                repeated,
                "request_id",
                f"repeats {value!r} (first seen at row {first}); request ids must be unique",
            )
        self.ids = series
        return series

    def arrivals(self) -> pl.Series:
        series = self.df["arrival_s"]
        if not series.dtype.is_numeric():
            raise self.fail(None, "arrival_s", f"has type {series.dtype}; expected {EXPECTED_TYPES['arrival_s']}")
        series = series.cast(pl.Float64)
        self.check_no_nulls("arrival_s", "seconds from the trace start")
        self.fail_at_first(
            ~series.is_finite(),
            "arrival_s",
            lambda row: f"is {series[row]}; expected a finite number of seconds",
        )
        self.fail_at_first(
            series < 0,
            "arrival_s",
            lambda row: f"is negative ({series[row]}); arrival times must be >= 0 seconds from the trace start",
        )
        self.fail_at_first(
            series > MAX_ARRIVAL_S,
            "arrival_s",
            # repr, not :g: 1e12 + 1 printed as 1e+12, "is 1e+12; ... at most 1e+12", a refusal that contradicted itself
            lambda row: f"is {series[row]!r}; arrival times must be at most {MAX_ARRIVAL_S:g} seconds from the trace "
            "start (a timestamp, not an offset?)",
        )
        self.fail_at_first(
            series.diff() < 0,
            "arrival_s",
            lambda row: f"decreases ({series[row]} after {series[row - 1]}); arrival times must be non-decreasing",
        )
        return series

    def token_count(self, column: str) -> pl.Series:
        series = self.df[column]
        what = "an integer >= 1"
        if series.dtype.is_float():
            self.check_no_nulls(column, what)
            self.fail_at_first(
                ~series.is_finite() | (series != series.floor()),
                column,
                lambda row: f"is {series[row]}, not an integer; expected {what}",
            )
        elif not series.dtype.is_integer():
            raise self.fail(None, column, f"has type {series.dtype}; expected {EXPECTED_TYPES[column]}")
        self.check_no_nulls(column, what)
        original = series
        series = series.cast(pl.Int64, strict=False)  # a uint64 or float beyond int64 becomes null
        self.fail_at_first(
            series.is_null(),
            column,
            lambda row: f"is {original[row]}; expected an integer below 2**63",
        )
        self.fail_at_first(
            series < 1,
            column,
            lambda row: f"is {series[row]}; token counts must be >= 1",
        )
        return series

    def id_lists(self, column: str) -> pl.Series:
        """A list-of-integers column with no null lists and no null elements, as List(Int64)."""
        series = self.df[column]
        dtype = series.dtype
        if isinstance(dtype, pl.Array) and dtype.inner.is_integer():
            # A list of one length for every row (polars makes one of a 2-D numpy array of token ids, parquet stores
            # it as a fixed-size list): the same ids, refused as "not a list" before.
            series = series.cast(pl.List(dtype.inner))
            dtype = series.dtype
        if not (isinstance(dtype, pl.List) and dtype.inner.is_integer()):
            raise self.fail(None, column, f"has type {dtype}; expected {EXPECTED_TYPES[column]}")
        self.check_no_nulls(column, EXPECTED_TYPES[column])
        self.fail_at_first(
            series.list.drop_nulls().list.len() != series.list.len(),
            column,
            lambda row: f"contains a null element; expected {EXPECTED_TYPES[column]}",
        )
        original = series
        series = series.cast(pl.List(pl.Int64), strict=False)  # a uint64 element beyond int64 becomes null
        self.fail_at_first(
            series.list.drop_nulls().list.len() != series.list.len(),
            column,
            lambda row: f"holds {original[row].max()}, beyond int64; expected {EXPECTED_TYPES[column]} "
            "below 2**63",
        )
        return series

    def hash_ids(self, prompt_tokens: pl.Series, hash_block_size: int | None) -> pl.Series:
        if hash_block_size is None:
            raise TraceError(
                f"{self.source}: column 'hash_ids' is present but the block size is unknown: "
                "the parquet schema metadata has no 'hash_block_size' key (the number of prompt "
                "tokens each hash id names); write the trace with save_trace(..., hash_block_size=N)"
            )
        if (isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int)
                or not 1 <= hash_block_size <= MAX_HASH_BLOCK_SIZE):
            raise TraceError(
                f"{self.source}: hash_block_size is {hash_block_size!r}; expected an integer from 1 to "
                f"{MAX_HASH_BLOCK_SIZE} (tokens per hash block)"
            )
        series = self.id_lists("hash_ids")
        lengths = series.list.len().cast(pl.Int64)
        expected = (prompt_tokens + (hash_block_size - 1)) // hash_block_size
        self.fail_at_first(
            lengths != expected,
            "hash_ids",
            lambda row: (
                f"has {lengths[row]} ids but prompt_tokens {prompt_tokens[row]} with hash_block_size "
                f"{hash_block_size} needs ceil({prompt_tokens[row]}/{hash_block_size}) = {expected[row]}"
            ),
        )
        return series

    def prompt_token_ids(self, prompt_tokens: pl.Series) -> pl.Series:
        series = self.id_lists("prompt_token_ids")
        self.fail_at_first(
            series.list.min() < 0,
            "prompt_token_ids",
            lambda row: f"contains a negative token id ({series.list.min()[row]}); token ids must be >= 0",
        )
        lengths = series.list.len().cast(pl.Int64)
        self.fail_at_first(
            lengths != prompt_tokens,
            "prompt_token_ids",
            lambda row: f"has {lengths[row]} ids but prompt_tokens is {prompt_tokens[row]}; they must be equal",
        )
        return series

    def session_ids(self) -> pl.Series:
        series = _text_of_categories(self.df["session_id"])
        if series.dtype.is_integer():
            return self.as_int64(series, "session_id", "an int64 or string session id")
        if series.dtype in (pl.String, pl.Null):
            return series.cast(pl.String) if series.dtype == pl.Null else series
        raise self.fail(None, "session_id", f"has type {series.dtype}; expected {EXPECTED_TYPES['session_id']}")


def validate(df: pl.DataFrame, source: str, hash_block_size: int | None) -> pl.DataFrame:
    """Return `df` checked against the trace schema, with normalised dtypes.

    Raises TraceError naming the source, the first bad row (0-based, with its request_id
    when that column is valid), the column, and what was expected. Columns come back in
    the order: required, optional present, then any extra columns unchanged.
    """
    if df.height == 0:
        raise TraceError(f"{source}: the trace is empty (zero rows); expected at least one request")
    missing = [name for name in REQUIRED_COLUMNS if name not in df.columns]
    if missing:
        raise TraceError(
            f"{source}: missing required column(s) {', '.join(repr(m) for m in missing)}; "
            f"found {df.columns}; a trace needs {', '.join(REQUIRED_COLUMNS)}"
        )
    checker = _Checker(df, source)
    columns: dict[str, pl.Series] = {"request_id": checker.request_ids()}
    columns["arrival_s"] = checker.arrivals()
    columns["prompt_tokens"] = checker.token_count("prompt_tokens")
    columns["output_tokens"] = checker.token_count("output_tokens")
    if "prompt_token_ids" in df.columns:
        columns["prompt_token_ids"] = checker.prompt_token_ids(columns["prompt_tokens"])
    if "hash_ids" in df.columns:
        columns["hash_ids"] = checker.hash_ids(columns["prompt_tokens"], hash_block_size)
    if "session_id" in df.columns:
        columns["session_id"] = checker.session_ids()
    extras = [df[name] for name in df.columns if name not in columns]
    return pl.DataFrame([series.alias(name) for name, series in columns.items()] + extras)
