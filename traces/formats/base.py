"""What every format reader takes and returns, and the clean-up steps they share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl


@dataclass(frozen=True)
class ConvertOptions:
    """Command-line options a reader may use; readers ignore what does not apply to them."""

    limit: int | None = None  # keep the first N requests by arrival
    tokenizer: str | None = None  # local Hugging Face tokenizer directory (sharegpt)
    qps: float | None = None  # requests/s: Poisson arrivals (sharegpt, vidur without times) or rescale
    seed: int = 0
    think_time_s: float = 30.0  # mean gap between turns of one conversation (sharegpt)
    think_time_cv: float = 1.0  # 1 = exponential think times, 0 = fixed


@dataclass(frozen=True)
class Converted:
    """A reader's result: trace columns (not yet sorted or validated) and what was left out."""

    requests: pl.DataFrame
    hash_block_size: int | None = None
    num_dropped: int = 0
    drop_reason: str = ""
    arrivals_assigned: bool = False  # True when arrivals were drawn at --qps, not recorded


def drop_zero_lengths(frame: pl.DataFrame, what: str) -> tuple[pl.DataFrame, int, str]:
    """Remove requests with no prompt or no output tokens, which no engine can serve.

    Returns the kept rows, how many were dropped and a phrase for the summary line.
    """
    empty = (pl.col("prompt_tokens") == 0) | (pl.col("output_tokens") == 0)
    num_dropped = frame.select(empty.sum()).item()
    reason = f"dropped {num_dropped} {what} with 0 prompt or 0 output tokens" if num_dropped else ""
    return frame.filter(~empty), int(num_dropped), reason


def row_ids(num: int) -> np.ndarray:
    """Request ids that point back to the source: the 0-based record index in the file."""
    return np.arange(num, dtype=np.int64)
