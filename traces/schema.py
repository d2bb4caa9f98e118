"""The trace type every other package uses, and its parquet storage.

A trace is one table of requests (see `traces/README.md` for the columns) stored as a
parquet file. The block size behind `hash_ids` lives in the file's schema metadata under
`hash_block_size`, so the file alone says how to expand hash ids into tokens. Loading
always validates, so code downstream can trust dtypes, ordering and lengths.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from engine.core.messages import one_line
from traces.errors import TraceError, row_error
from traces.files import is_link_loop, make_folders, open_parquet, remove_empty, remove_stale_staging, staging_path
from traces.token_synth import tokens_from_hash_ids_array, tokens_from_row_array
from traces.validation import (
    EXPECTED_TYPES,
    MAX_ARRIVAL_S,
    MAX_HASH_BLOCK_SIZE,
    OPTIONAL_COLUMNS,
    REQUIRED_COLUMNS,
    validate,
)

__all__ = [
    "HASH_BLOCK_SIZE_KEY",
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "Trace",
    "TraceError",
    "load_trace",
    "save_trace",
    "validate",
]

HASH_BLOCK_SIZE_KEY = b"hash_block_size"


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated request table; build one with `Trace.from_frame` or `load_trace`."""

    requests: pl.DataFrame
    hash_block_size: int | None
    source: str

    @classmethod
    def from_frame(cls, df: pl.DataFrame, source: str, hash_block_size: int | None = None) -> Trace:
        """Validate `df` and wrap it; `hash_block_size` is dropped when there are no hash_ids."""
        requests = validate(df, source, hash_block_size)
        block_size = hash_block_size if "hash_ids" in requests.columns else None
        return cls(requests=requests, hash_block_size=block_size, source=source)

    @classmethod
    def of_valid_columns(cls, requests: pl.DataFrame, source: str, hash_block_size: int | None,
                         hash_id_offsets: tuple[np.ndarray, np.ndarray] | None = None) -> Trace:
        """A table valid by construction, not checked again: columns in the order and with the dtypes `validate`
        gives them, rows that pass its checks (a capacity search's streams: a validated trace's rows resampled,
        analysis.capacity.workload). `hash_id_offsets`: its hash ids as `_hash_id_offsets` flattens them, where the
        caller made them so (the column is not read back)."""
        trace = cls(requests=requests, hash_block_size=hash_block_size if "hash_ids" in requests.columns else None,
                    source=source)
        if hash_id_offsets is not None:
            trace.__dict__["_hash_id_offsets"] = hash_id_offsets  # (the cached_property's own slot)
        return trace

    def __len__(self) -> int:
        return self.requests.height

    def _replace_requests(self, requests: pl.DataFrame) -> Trace:
        return Trace(requests=requests, hash_block_size=self.hash_block_size, source=self.source)

    def head(self, n: int) -> Trace:
        """The first `n` requests in row order (all of them if `n` exceeds the length)."""
        if n < 1:
            raise ValueError(f"head needs n >= 1 (a trace holds at least one request), got {n}")
        return self._replace_requests(self.requests.head(min(n, len(self))))  # polars refuses n >= 2**64

    def with_time_scale(self, scale: float) -> Trace:
        """Stretch (scale > 1) or compress (scale < 1) the gaps after the first arrival."""
        if not scale > 0 or not np.isfinite(scale):
            raise ValueError(f"time scale must be a finite number > 0, got {scale}")
        arrival = pl.col("arrival_s")
        first = arrival.first()
        scaled = self.requests.with_columns(first + (arrival - first) * scale)
        last_s = float(scaled["arrival_s"][-1])
        # The bound a loaded trace is held to, not only finiteness: a finite but huge arrival (--qps 1e-300)
        # replayed the whole trace and then failed writing its run with a traceback (run tables refuse it too).
        if not last_s <= MAX_ARRIVAL_S:
            raise ValueError(f"{self.source}: time scale {scale:g} stretches the last arrival to {last_s:g} s; "
                             f"expected at most {MAX_ARRIVAL_S:g} s (a smaller scale or a larger qps)")
        return self._replace_requests(scaled)

    def from_first_arrival(self) -> Trace:
        """The same requests, their arrival times counted from the first one's (which then arrives at 0 s), in the
        same order. Exact for arrivals up to twice the first (Sterbenz): timestamps' gaps come out as they were."""
        arrival = pl.col("arrival_s")
        return self._replace_requests(self.requests.with_columns(arrival - arrival.first()))

    def offline(self) -> Trace:
        """Every request arrives at time 0, as in an offline batch run."""
        return self._replace_requests(self.requests.with_columns(pl.lit(0.0, dtype=pl.Float64).alias("arrival_s")))

    def with_qps(self, qps: float) -> Trace:
        """Rescale gaps so the mean rate `(num_requests - 1) / span` equals `qps` requests/s."""
        if not qps > 0 or not np.isfinite(qps):
            raise ValueError(f"qps must be a finite number > 0, got {qps}")
        arrivals = self.requests["arrival_s"]
        span_s = float(arrivals[-1] - arrivals[0])
        if span_s <= 0:
            raise ValueError(
                f"{self.source}: qps cannot be set on a trace whose requests all arrive at once "
                f"({len(self)} request(s) at {arrivals[0]} s): there is no rate to rescale; replay it as it is "
                "(without --qps), offline (--offline), or give its requests arrival times first"
            )
        current_qps = (len(self) - 1) / span_s
        scale = current_qps / qps
        last_s = float(arrivals[0]) + span_s * scale
        # Named here, in the qps asked for: with_time_scale's message spoke of a "time scale 3.1e+300" and "a smaller
        # scale", which neither traces.convert nor a replay given --qps was asked for.
        if not last_s <= MAX_ARRIVAL_S:  # inf and NaN too
            raise ValueError(f"{self.source}: qps {qps:g} is too small: it spreads the {len(self)} requests over "
                             f"{span_s * scale:.3g} s (the trace runs at {current_qps:.4g} requests/s); expected "
                             f"at most {MAX_ARRIVAL_S:g} s from the trace start to its last arrival (a larger qps)")
        return self.with_time_scale(scale)

    # --- prompt token ids ------------------------------------------------------------

    @cached_property
    def _hash_id_offsets(self) -> tuple[np.ndarray, np.ndarray]:
        """All hash ids flattened into one array plus row offsets, built once per trace."""
        column = self.requests["hash_ids"]
        flat = column.explode().to_numpy().astype(np.int64, copy=False)
        offsets = np.zeros(len(column) + 1, dtype=np.int64)
        np.cumsum(column.list.len().to_numpy(), out=offsets[1:])
        return flat, offsets

    def _check_row(self, row: int) -> None:
        if not 0 <= row < len(self):
            raise IndexError(f"{self.source}: row {row} is out of range for a trace of {len(self)} requests")

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise TraceError naming the first row whose stored ``prompt_token_ids`` hold an id outside
        ``[0, vocab_size)``: replays call it before they start, as the row would otherwise fail only when
        it arrives, mid-run (synthesised prompts are always inside the vocabulary)."""
        if "prompt_token_ids" not in self.requests.columns:
            return
        largest = self.requests["prompt_token_ids"].list.max()
        beyond = np.flatnonzero((largest >= vocab_size).fill_null(False).to_numpy())
        if beyond.size:
            self.prompt_token_array(int(beyond[0]), vocab_size)  # raises the row's error, with its position

    def prompt_token_array(self, row: int, vocab_size: int, seed: int = 0) -> np.ndarray:
        """`prompt_token_ids` as an int64 numpy array (the fast path: no Python list)."""
        self._check_row(row)
        num_tokens = int(self.requests["prompt_tokens"][row])
        if "prompt_token_ids" in self.requests.columns:
            ids = self.requests["prompt_token_ids"][row].to_numpy().astype(np.int64, copy=False)
            too_big = np.flatnonzero(ids >= vocab_size)
            if too_big.size:
                raise row_error(
                    self.source,
                    row,
                    self.requests["request_id"][row],
                    "prompt_token_ids",
                    f"holds token id {int(ids[too_big[0]])} at position {int(too_big[0])}, "
                    f"outside the vocabulary [0, {vocab_size})",
                )
            return ids
        if "hash_ids" in self.requests.columns:
            flat, offsets = self._hash_id_offsets
            hash_ids = flat[offsets[row] : offsets[row + 1]]
            assert self.hash_block_size is not None  # validated: hash_ids imply a block size
            return tokens_from_hash_ids_array(hash_ids, num_tokens, self.hash_block_size, vocab_size)
        return tokens_from_row_array(row, num_tokens, seed, vocab_size)

    def prompt_token_ids(self, row: int, vocab_size: int, seed: int = 0) -> list[int]:
        """The prompt of request `row` as token ids in [0, vocab_size), deterministically.

        Stored `prompt_token_ids` are returned as they are; `hash_ids` expand to blocks that
        depend only on the hash id and the position in the block (so shared ids give shared
        prefixes); otherwise the ids depend only on (seed, row) and requests share nothing.
        """
        return self.prompt_token_array(row, vocab_size, seed).tolist()


def _read_table(path: Path, source: str) -> pa.Table:
    if not path.exists():
        raise TraceError(f"{source}: cannot read the trace: "
                         f"{'a symbolic link loop' if is_link_loop(path) else 'no such file'}")
    if path.is_dir():
        raise TraceError(f"{source}: cannot read the trace: it is a directory, expected a parquet file")
    if not path.is_file():  # a FIFO or a device: its size (0) says nothing of what it holds
        raise TraceError(f"{source}: cannot read the trace: not a regular file (a device, FIFO or socket); "
                         "expected a parquet file")
    try:
        size_bytes = path.stat().st_size
    except OSError as exc:
        raise TraceError(f"{source}: cannot read the trace: {exc.strerror or exc}") from exc
    if size_bytes == 0:
        raise TraceError(f"{source}: the file is empty (0 bytes); expected a parquet trace")
    try:
        return open_parquet(path).read()
    except PermissionError as exc:
        raise TraceError(f"{source}: cannot read the trace: permission denied") from exc
    except (OSError, pa.ArrowException) as exc:
        hint = _conversion_hint(path)
        expected = (f"a trace parquet: convert this file first (python -m traces.convert {hint} {source} -o "
                    "TRACE.parquet)" if hint else "a trace written by save_trace")
        raise TraceError(f"{source}: not a readable parquet file ({exc}); expected {expected}") from exc


def _conversion_hint(path: Path) -> str | None:
    """The traces.convert format of a public trace given as it was downloaded, read from its first line as the
    converters' own errors read it, or None. By the name's suffix alone, the Azure CSV was told "{azure|burstgpt|
    vidur}", a compressed one (.csv.gz) nothing, and any .json (a run's summary.json, a profile) "sharegpt"."""
    from traces.formats.guess import guess_format  # the converters' modules, only once a file is refused

    guess = guess_format(path)
    if guess is not None:
        return guess[0]
    # A CSV of no known header may still be one of them, laid out otherwise: name the CSV formats.
    return "{azure|burstgpt|vidur}" if path.suffix.lower() == ".csv" else None


def _block_size_from_metadata(table: pa.Table, source: str) -> int | None:
    raw = (table.schema.metadata or {}).get(HASH_BLOCK_SIZE_KEY)
    if raw is None:
        return None
    # Plain decimal digits only: int() also takes "1_6", "+16", " 16 " and other scripts' digits, none of which
    # save_trace writes.
    value = int(raw) if raw.isdigit() and len(raw) <= 20 else 0  # bytes.isdigit: ASCII digits alone
    if not 1 <= value <= MAX_HASH_BLOCK_SIZE:
        raise TraceError(
            f"{source}: schema metadata 'hash_block_size' is {raw[:40]!r}; expected a decimal integer from 1 to "
            f"{MAX_HASH_BLOCK_SIZE}"
        )
    return value


def load_trace(path: str | Path) -> Trace:
    """Read and validate a parquet trace; any problem raises TraceError naming the file."""
    path = Path(path)
    source = str(path)
    table = _read_table(path, source)
    block_size = _block_size_from_metadata(table, source)
    names = table.column_names
    repeated = [name for i, name in enumerate(names) if name in names[:i]]
    if repeated:  # parquet allows it, polars does not (a DuplicateError traceback); which column holds the data?
        raise TraceError(f"{source}: column {repeated[0]!r} appears more than once; expected each column once")
    # An extra column (every tool ignores it) of a type polars cannot hold is left out, not converted: polars
    # panics on some (decimal256), printing a Rust backtrace even when the panic is caught.
    unheld = [name for name in names if name not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS
              and not _polars_holds(table.schema.field(name).type)]
    # One of the trace's own columns of such a type is refused, named: polars' panic was a traceback of ~90 lines.
    wide = next((name for name in names
                 if name in EXPECTED_TYPES and _holds_decimal256(table.schema.field(name).type)), None)
    if wide is not None:
        raise TraceError(f"{source}: column {wide!r} has type {table.schema.field(wide).type} (a 256-bit decimal, "
                         f"which polars cannot read); expected {EXPECTED_TYPES[wide]}")
    if unheld:
        table = table.drop_columns(unheld)
    try:
        frame = pl.from_arrow(table)
    except (pl.exceptions.PolarsError, pa.ArrowException) as exc:  # a column type polars cannot hold
        reason = one_line(exc)[:200]
        raise TraceError(f"{source}: cannot read its columns ({reason}); expected a trace written by save_trace") \
            from None
    assert isinstance(frame, pl.DataFrame)
    return Trace.from_frame(frame, source, block_size)


def _holds_decimal256(arrow_type: pa.DataType) -> bool:
    """Whether a column of this arrow type holds a decimal256 anywhere (alone, in a list, a dictionary, a map or a
    struct), on which polars' conversion panics."""
    types = pa.types
    if types.is_decimal256(arrow_type):
        return True
    if types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type) \
            or types.is_dictionary(arrow_type):
        return _holds_decimal256(arrow_type.value_type)
    if types.is_map(arrow_type):
        return _holds_decimal256(arrow_type.key_type) or _holds_decimal256(arrow_type.item_type)
    if types.is_struct(arrow_type):
        return any(_holds_decimal256(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    return False


def _polars_holds(arrow_type: pa.DataType) -> bool:
    """Whether polars converts a column of this arrow type (the plain kinds a trace's extra columns have)."""
    types = pa.types
    if types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type):
        return _polars_holds(arrow_type.value_type)
    if types.is_dictionary(arrow_type):
        return _polars_holds(arrow_type.value_type)
    if types.is_struct(arrow_type):
        return all(_polars_holds(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    return (types.is_integer(arrow_type) or types.is_float32(arrow_type) or types.is_float64(arrow_type)
            or types.is_boolean(arrow_type) or types.is_string(arrow_type) or types.is_large_string(arrow_type)
            or types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or types.is_null(arrow_type)
            or types.is_timestamp(arrow_type) or types.is_date(arrow_type) or types.is_duration(arrow_type)
            or types.is_decimal128(arrow_type))


def _check_writable_target(path: Path) -> None:
    """Refuse, as an OSError naming the problem, a target the rename below would mishandle."""
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory; expected a parquet file path", str(path))
    if path.exists() and not path.is_file():  # a device or FIFO: the rename would replace the node itself
        raise OSError(errno.EEXIST, "exists and is not a regular file (a device, FIFO or socket); "
                      "expected a parquet file path", str(path))
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{parent} is a file, not a folder", str(path))
            break


def save_trace(trace_or_df: Trace | pl.DataFrame, path: str | Path, hash_block_size: int | None = None) -> None:
    """Validate and write a trace as zstd parquet; same input gives the same bytes.

    `hash_block_size` defaults to the Trace's own; it is stored in the schema metadata
    only when the table has `hash_ids`.
    """
    path = Path(path)
    if isinstance(trace_or_df, Trace):
        frame = trace_or_df.requests
        block_size = hash_block_size if hash_block_size is not None else trace_or_df.hash_block_size
    else:
        frame = trace_or_df
        block_size = hash_block_size
    trace = Trace.from_frame(frame, str(path), block_size)
    table = trace.requests.to_arrow()
    metadata = dict(table.schema.metadata or {})
    if trace.hash_block_size is not None:
        metadata[HASH_BLOCK_SIZE_KEY] = str(trace.hash_block_size).encode("ascii")
    table = table.replace_schema_metadata(metadata or None)
    _check_writable_target(path)
    # Written beside the target and renamed over it: an interrupted write never leaves half a trace.
    partial = staging_path(path, "partial")  # shortened where .NAME.partial-PID would exceed a file name's limit
    made: list[Path] = []
    written = False
    try:
        make_folders(path.parent, made)
        remove_stale_staging(path)
        with open(partial, "wb") as handle:  # pyarrow parses a path as a UTF-8 URI: a name with another byte failed
            pq.write_table(table, handle, compression="zstd", compression_level=9)
        os.replace(partial, path)
        written = True
    finally:
        partial.unlink(missing_ok=True)
        if not written:  # -o new/deeper/t.parquet on a full disk, or interrupted, left new/deeper/ behind, empty
            remove_empty(made)
