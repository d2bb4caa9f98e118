"""Helpers for the traces tests: real trace paths, the tiny tokenizer's vocabulary, frame builders."""

from __future__ import annotations

import subprocess
import sys
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


def cli_error(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run a CLI's `main` on bad input: exit status 2 and one error line (argparse's usage lines may come
    before it), no traceback. Returns the error line."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    stderr = capsys.readouterr().err
    assert status == 2, f"exit status {status}, stderr:\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1 and lines[-1] == errors[0], f"expected one error line, got:\n{stderr}"
    assert lines[:-1] == [] or lines[0].startswith("usage:"), f"unexpected output before the error:\n{stderr}"
    return lines[-1]


def dead_pid() -> int:
    """The id of a process that ran and is gone (reaped: a zombie still holds its id)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def link_loop(folder: Path, name: str, other: str) -> Path:
    """``folder/name``, a symbolic link to ``folder/other``, which links back to it: a path no read resolves."""
    loop = folder / name
    loop.symlink_to(folder / other)
    (folder / other).symlink_to(loop)
    return loop
