"""Mooncake traces (Qin et al., FAST 2025; kvcache-ai/Mooncake, FAST25-release/traces).

JSON lines with `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, each
naming one 512-token block of the prompt (the last may be partial). Arrival = timestamp -
earliest timestamp kept, as for the other formats: a file of epoch milliseconds starts at 0 too.
hash_ids are kept with hash_block_size 512 (--hash-block-size N for a trace synthesized in
this layout with other blocks), so replays can synthesize prompts that share the prefixes
the trace records. A file whose records carry no hash ids (the key absent, null or an
empty list: the length-only layout other tools write) converts without them, and its
prompts share no prefix; a file that gives ids for some prompts and not for others is
refused at the first record that breaks the pattern. Requests with 0 input or 0 output
tokens are dropped and counted. request_id is the 0-based record index in the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


def _parse_record(path: Path, line_no: int, line: str, block_tokens: int) -> tuple[float, int, int, list[int] | None]:
    """(timestamp ms, input_length, output_length, hash_ids) of one line; hash_ids None when the record gives none
    for a prompt that has tokens (see _hash_ids)."""
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
    for field in ("timestamp", "input_length", "output_length"):
        if field not in record:
            raise fail(f"field {field!r} is missing; expected timestamp, input_length, output_length (and hash_ids)")
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
    return timestamp, lengths[0], lengths[1], _hash_ids(fail, record, lengths[0], block_tokens)


def _hash_ids(fail: Callable[[str], TraceError], record: dict, input_length: int,
              block_tokens: int) -> list[int] | None:
    """The record's hash ids, checked against its input_length; None when it gives none for a prompt of tokens (the
    key absent, null or []), as files that publish only lengths do: they were refused as 'hash_ids is missing'."""
    hash_ids = record.get("hash_ids")
    if hash_ids is None or (hash_ids == [] and input_length > 0):
        return None
    if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
        raise fail(f"field 'hash_ids' is not a list of integers (each within int64): {shown(hash_ids)}")
    expected = cdiv(input_length, block_tokens)
    if len(hash_ids) != expected:
        # Traces synthesized in this layout (benchmark tools' generators) may cut prompts into other blocks: with no
        # way to say so, such a file could not be converted at all.
        other = " (a trace of blocks of another size converts with --hash-block-size N)" \
            if block_tokens == MOONCAKE_BLOCK_TOKENS else ""
        raise fail(
            f"field 'hash_ids' has {len(hash_ids)} ids but input_length {input_length} needs "
            f"ceil({input_length}/{block_tokens}) = {expected}{other}"
        )
    return hash_ids


def _check_hash_ids_given(path: Path, line_no: int, given: bool, first: tuple[int, bool] | None) -> tuple[int, bool]:
    """The first record that gave a prompt of tokens (line, whether it had hash ids), raising for a later one that
    differs: a trace keeps hash ids for every prompt or for none (a prompt without them would share no prefix with
    the others, a silent loss of the reuse the file records)."""
    if first is None:
        return line_no, given
    first_line, first_given = first
    if given != first_given:
        this, that = ("gives ids", "gives none") if given else ("is missing or empty", "gives ids")
        raise TraceError(f"{path}: line {line_no}: field 'hash_ids' {this}, while line {first_line} (the first "
                         f"prompt) {that}; expected hash ids for every prompt of tokens or for none")
    return first


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
    first_prompt: tuple[int, bool] | None = None  # (line, whether it gave hash ids) of the first prompt of tokens
    block_tokens = options.hash_block_size or MOONCAKE_BLOCK_TOKENS
    try:
        with open_text(path) as lines:  # compressed or not; a byte order mark (Windows editors) is no JSON
            for line_no, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                record = _parse_record(path, line_no, line, block_tokens)
                if record[1] > 0:  # a prompt of 0 tokens has no blocks either way (and is dropped)
                    first_prompt = _check_hash_ids_given(path, line_no, record[3] is not None, first_prompt)
                for name, value in zip(columns, record):
                    columns[name].append(value)
    except READ_ERRORS as exc:
        raise TraceError(read_error(path, exc)) from None
    if not columns["timestamp_ms"]:
        raise TraceError(f"{path}: no records; expected JSON lines with timestamp, input_length, output_length, "
                         "hash_ids")
    with_hash_ids = first_prompt is None or first_prompt[1]
    if not with_hash_ids:
        del columns["hash_ids"]
    requests = pl.DataFrame(
        columns,
        schema={"timestamp_ms": pl.Float64, "prompt_tokens": pl.Int64, "output_tokens": pl.Int64}
        | ({"hash_ids": pl.List(pl.Int64)} if with_hash_ids else {}),
    ).with_row_index("request_id")
    # Subtracted in ms, then scaled: epoch milliseconds (~1.7e12) keep their exact differences this way. numpy
    # divides correctly rounded; polars multiplies by 1/1000, which gave 5.9990000000000006 for 5999 ms.
    timestamps_ms = requests["timestamp_ms"].to_numpy()
    origin_ms = time_origin(timestamps_ms, requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy())
    requests = requests.with_columns(
        pl.col("request_id").cast(pl.Int64),
        arrival_s=pl.Series((timestamps_ms - origin_ms) / 1000.0),
    ).select("request_id", "arrival_s", "prompt_tokens", "output_tokens", *(["hash_ids"] if with_hash_ids else []))
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "request{s}")
    note = ", ".join(part for part in ("" if with_hash_ids else "no hash_ids in the file (prompts share no prefix)",
                                       _seconds_note(timestamps_ms)) if part)
    return Converted(requests, hash_block_size=block_tokens if with_hash_ids else None,
                     kept_before_drops=kept_before_drops, drop_note=drop_note, note=note)


def _seconds_note(timestamps_ms: np.ndarray) -> str:
    """A warning for timestamps that look like seconds: fractional values less than one apart (the median gap
    between distinct times). Read as milliseconds, as the format says, such a file's arrivals came 1,000 times
    closer together than recorded, and its replay judged a load 1,000 times the real one without a word. Published
    Mooncake traces record whole milliseconds; a whole-number file is never flagged, however dense."""
    if np.all(timestamps_ms == np.floor(timestamps_ms)):
        return ""
    gaps_ms = np.diff(np.unique(timestamps_ms))
    if not len(gaps_ms) or np.median(gaps_ms) >= 1.0:
        return ""
    return (f"warning: the timestamps look like seconds (fractional, median gap {np.median(gaps_ms):.3g}), but "
            "Mooncake timestamps are milliseconds: if they are seconds, multiply them by 1000")
