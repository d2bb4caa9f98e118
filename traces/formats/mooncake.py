"""Mooncake traces (Qin et al., FAST 2025; kvcache-ai/Mooncake, FAST25-release/traces).

JSON lines with `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, each
naming one 512-token block of the prompt (the last may be partial). Arrival = timestamp -
earliest timestamp kept, as for the other formats: a file of epoch milliseconds starts at 0 too.
hash_ids are kept with hash_block_size 512, so replays can synthesize prompts that
share the prefixes the trace records. Requests with 0 input or 0 output tokens are
dropped and counted. request_id is the 0-based record index in the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from engine.core.config import cdiv
from engine.core.json_errors import json_problem
from engine.core.messages import shown
from traces.errors import TraceError
from traces.formats.base import (
    Converted,
    ConvertOptions,
    RepeatedKey,
    drop_zero_lengths,
    json_error_at,
    json_syntax_hint,
    time_origin,
    unique_keys,
)
from traces.formats.tabular import READ_ERRORS, check_source_file, open_text, read_error
from traces.validation import MAX_ARRIVAL_S

MOONCAKE_BLOCK_TOKENS = 512
MAX_TIMESTAMP_MS = MAX_ARRIVAL_S * 1000


def _is_int(value: object) -> bool:
    """An int64 (JSON has no bound on integers; the trace stores them as int64)."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _count(value: object) -> int | None:
    """A token count as an int: an int64, or a whole float such as 6955.0 (pandas writes integer columns that held a
    missing value as floats, and such files were refused though they say the same); None for anything else."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2.0**63:
        return int(value)
    return value if _is_int(value) else None


def _parse_record(path: Path, line_no: int, line: str) -> tuple[float, int, int, list[int]]:
    """(timestamp ms, input_length, output_length, hash_ids) of one line."""
    def fail(problem: str) -> TraceError:
        return TraceError(f"{path}: line {line_no}: {problem}")

    try:
        record = json.loads(line, object_pairs_hook=unique_keys)
    except RepeatedKey as exc:
        raise fail(exc.problem) from None
    except json.JSONDecodeError as exc:
        hint = _layout_hint(line_no, line) or json_syntax_hint(line, exc, "line")
        raise fail(f"not valid JSON ({json_error_at(exc)}){hint}") from None
    except RecursionError:  # arrays nested thousands deep: no record looks like that
        raise fail("JSON nested too deeply to read; expected one object per line") from None
    except ValueError as exc:  # an integer of 5000 digits: the message named neither the file nor the line
        raise fail(f"cannot read the JSON ({json_problem(exc)}); expected one object per line") from None
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {type(record).__name__}")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        if field not in record:
            raise fail(f"field {field!r} is missing; expected timestamp, input_length, output_length, hash_ids")
    timestamp = record["timestamp"]
    # The trace's bound on arrivals, in ms: past it the error named the converted row, not this line.
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not 0 <= timestamp <= MAX_TIMESTAMP_MS:
        raise fail(f"field 'timestamp' is {shown(repr(timestamp))}; expected milliseconds from 0 to "
                   f"{MAX_TIMESTAMP_MS:g}")
    lengths = []
    for field in ("input_length", "output_length"):
        value = _count(record[field])
        if value is None or value < 0:
            raise fail(f"field {field!r} is {shown(repr(record[field]))}; expected an integer from 0 to 2**63 - 1")
        lengths.append(value)
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
        raise fail(f"field 'hash_ids' is not a list of integers (each within int64): {shown(hash_ids)}")
    expected = cdiv(lengths[0], MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise fail(
            f"field 'hash_ids' has {len(hash_ids)} ids but input_length {lengths[0]} needs "
            f"ceil({lengths[0]}/{MOONCAKE_BLOCK_TOKENS}) = {expected}"
        )
    return timestamp, lengths[0], lengths[1], hash_ids


def _layout_hint(line_no: int, line: str) -> str:
    """Why the first line is no JSON object when the file is laid out otherwise: a pretty-printed JSON array opens
    with '[' alone ('Expecting value at column 1' said nothing of it), a CSV with its header."""
    if line_no != 1:
        return ""
    head = line.strip()
    if head.startswith("["):
        return "; the file is a JSON array, expected one JSON object per line (JSON Lines)"
    if "," in head and not head.startswith("{"):
        return f"; the line reads like a CSV header ({head[:60]!r}), expected one JSON object per line (JSON Lines)"
    return ""


def read(path: Path, options: ConvertOptions) -> Converted:
    columns: dict[str, list] = {"timestamp_ms": [], "prompt_tokens": [], "output_tokens": [], "hash_ids": []}
    check_source_file(path, "a Mooncake JSONL file")
    try:
        with open_text(path) as lines:  # compressed or not; a byte order mark (Windows editors) is no JSON
            for line_no, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                for name, value in zip(columns, _parse_record(path, line_no, line)):
                    columns[name].append(value)
    except READ_ERRORS as exc:
        raise TraceError(read_error(path, exc)) from None
    if not columns["timestamp_ms"]:
        raise TraceError(f"{path}: no records; expected JSON lines with timestamp, input_length, output_length, "
                         "hash_ids")
    requests = pl.DataFrame(
        columns,
        schema={"timestamp_ms": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64,
                "hash_ids": pl.List(pl.Int64)},
    ).with_row_index("request_id")
    # Subtracted in ms, then scaled: epoch milliseconds (~1.7e12) keep their exact differences this way. numpy
    # divides correctly rounded; polars multiplies by 1/1000, which gave 5.9990000000000006 for 5999 ms.
    timestamps_ms = requests["timestamp_ms"].to_numpy()
    origin_ms = time_origin(timestamps_ms, requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy())
    requests = requests.with_columns(
        pl.col("request_id").cast(pl.Int64),
        arrival_s=pl.Series((timestamps_ms - origin_ms) / 1000.0),
    ).select("request_id", "arrival_s", "prompt_tokens", "output_tokens", "hash_ids")
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "request{s}")
    return Converted(requests, hash_block_size=MOONCAKE_BLOCK_TOKENS, kept_before_drops=kept_before_drops,
                     drop_note=drop_note)
