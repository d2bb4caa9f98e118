"""Helpers for the traces tests: real trace paths, the tiny tokenizer's vocabulary, frame builders."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL_TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
AZURE_2023 = REAL_TRACES / "azure_llm_2023_conv.csv"
MOONCAKE = REAL_TRACES / "mooncake_conversation.jsonl"

WORDS = ["hello", "world", "how", "are", "you", "fine", "thanks", "and", "what", "is", "a", "trace"]


def require(path: Path) -> Path:
    """Skip the test when a shared real trace is not on this machine."""
    if not path.is_file():
        pytest.skip(f"real trace {path} is absent (it lives in ../shared/traces, outside the repository)")
    return path


def word_ids(text: str) -> list[int]:
    """What the tiny tokenizer returns for `text`."""
    return [WORDS.index(word) + 1 if word in WORDS else 0 for word in text.split()]


def small_frame(**overrides: list) -> pl.DataFrame:
    """A valid three-request table; keyword arguments replace or add columns."""
    columns: dict[str, list] = {
        "request_id": ["a", "b", "c"],
        "arrival_s": [0.0, 1.5, 4.0],
        "prompt_tokens": [5, 600, 1024],
        "output_tokens": [1, 2, 3],
    }
    columns.update(overrides)
    return pl.DataFrame({name: pl.Series(name, values, strict=False) for name, values in columns.items()})
