"""What every format reader takes and returns, and the clean-up steps they share."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl


@dataclass(frozen=True)
class ConvertOptions:
    """Command-line options a reader may use; readers ignore what does not apply to them."""

    limit: int | None = None  # keep the first N requests by arrival
    tokenizer: str | None = None  # local Hugging Face tokenizer directory (sharegpt)
    qps: float | None = None  # requests/s: Poisson arrivals (sharegpt, vidur without times) or rescale
    seed: int | None = None  # of drawn arrivals (0 when None); given, a trace whose arrivals are recorded refuses it
    think_time_s: float = 30.0  # mean gap between turns of one conversation (sharegpt)
    think_time_cv: float = 1.0  # 1 = exponential think times, 0 = fixed
    hash_block_size: int | None = None  # tokens per hash_ids block (mooncake; None: the published traces' 512)

    @property
    def arrival_seed(self) -> int:
        return 0 if self.seed is None else self.seed


def _no_drops() -> np.ndarray:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Converted:
    """A reader's result: trace columns (not yet sorted or validated) and what was left out."""

    requests: pl.DataFrame
    hash_block_size: int | None = None
    # One entry per dropped source row: how many kept requests come before it in the order --limit takes them
    # (arrival order; file order for sharegpt). --limit N then counts only the drops among the rows it went
    # through, those before the N-th kept request, not the whole file's.
    kept_before_drops: np.ndarray = field(default_factory=_no_drops)
    drop_note: str = "dropped {} request{s} with 0 prompt or 0 output tokens"  # {} is the count, {s} its plural s
    arrivals_assigned: bool = False  # True when arrivals were drawn at --qps, not recorded
    note: str = ""  # what the summary line should say of the source beyond the drops ('' for nothing)

    def drop_reason(self, limit: int | None = None) -> str:
        """The summary line's phrase for the drops among the first `limit` requests ('' when there are none)."""
        drops = self.kept_before_drops
        num_dropped = len(drops) if limit is None else int((drops < limit).sum())
        return self.drop_note.format(num_dropped, s="" if num_dropped == 1 else "s") if num_dropped else ""


def time_origin(times: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.generic:
    """The time that becomes arrival 0: the earliest time of a request drop_zero_lengths keeps (of every row when it
    keeps none, and convert refuses the trace). From the earliest row of all, a failed request first in the file (a
    BurstGPT row with 0 response tokens) left the trace starting at its gap, not at 0: a replay sat idle that long,
    and --qps rescaled every gap but that one."""
    kept = _servable(prompt_tokens, output_tokens)
    return times[kept].min() if kept.any() else times.min()


def _servable(prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """The rows drop_zero_lengths keeps: at least one prompt and one output token."""
    return (prompt_tokens > 0) & (output_tokens > 0)


def drop_zero_lengths(frame: pl.DataFrame, what: str) -> tuple[pl.DataFrame, np.ndarray, str]:
    """Remove requests with no prompt or no output tokens, which no engine can serve.

    Returns the kept rows, stably sorted by arrival (the order convert keeps, in which --limit counts drops), for
    each dropped row how many kept rows precede it (Converted.kept_before_drops) and the summary line's phrase for
    a count (``what`` names the rows, "request{s}": ``{s}`` is the plural s).
    """
    frame = frame.sort("arrival_s", maintain_order=True)
    empty = ~_servable(frame["prompt_tokens"].to_numpy(), frame["output_tokens"].to_numpy())
    kept_before = np.cumsum(~empty) - ~empty
    note = f"dropped {{}} {what} with 0 prompt or 0 output tokens"
    return frame.filter(pl.Series(~empty)), kept_before[empty].astype(np.int64), note


def row_ids(num: int) -> np.ndarray:
    """Request ids that point back to the source: the 0-based record index in the file."""
    return np.arange(num, dtype=np.int64)


class RepeatedKey(Exception):
    """A JSON object names a key twice (not a ValueError: those are the JSON's own read errors)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    @property
    def problem(self) -> str:
        """What is wrong, for an error line that names the file (and line) before it."""
        key = self.key if len(self.key) <= 60 else self.key[:60] + "..."  # repr escapes a newline in it
        return f"key {key!r} appears twice in one object; expected each key once (JSON would keep the last value " \
               "silently)"


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``' object_pairs_hook: the object as a dict, refusing a key given twice. json keeps the last
    value of a repeated key with no word, so a Mooncake line's {"timestamp": 1, "timestamp": 2} became an arrival
    at 2 ms whichever of the two the file meant, and a ShareGPT turn's second "value" replaced its first."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return record


def json_syntax_hint(text: str, exc: json.JSONDecodeError, unit: str) -> str:
    """What a JSON syntax error in ``text`` (one ``unit``: "line" or "file") most likely means, for the slips that break
    trace files most often, or ''. json named only the symptom: JSON Lines written with a comma after each record
    failed as "Extra data at column 76", a record pretty-printed over several lines (as Mooncake's README shows
    them) as "Expecting property name enclosed in double quotes at column 1"."""
    before, after = text[: exc.pos].rstrip(), text[exc.pos :].strip()
    closes = ("]", "}")
    if (before.endswith(",") and after[:1] in closes) or (after[:1] == "," and after[1:].lstrip()[:1] in closes):
        closing = after.lstrip(",").lstrip()[0]
        return f"; a comma comes before {closing!r}, which JSON does not allow; remove it"
    if exc.msg == "Extra data" and after.startswith(","):
        return ("; a comma follows a complete JSON value: JSON Lines separate records by line breaks alone (no "
                "commas), and a list of records needs [ ] around it")
    if before and (not after or (exc.msg.startswith("Unterminated string") and '"' not in after[1:])):
        if unit == "line":
            return ("; the line ends inside a JSON value: expected one whole JSON object per line (a record spread "
                    "over several lines, as pretty-printed JSON writes it, or a line cut short?)")
        return "; the file ends inside a JSON value (cut short?)"
    return ""


def json_error_at(exc: json.JSONDecodeError) -> str:
    """json's reason and where on its line, 'Expecting value at column 7' ("Unterminated string starting at" ends
    with its own 'at', which was written twice)."""
    return f"{exc.msg} {'' if exc.msg.endswith(' at') else 'at '}column {exc.colno}"
