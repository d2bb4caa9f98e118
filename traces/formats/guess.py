"""Which format a source looks like, from its first line, for errors: a trace given with the wrong format name
failed on its first line's layout ('line 2: 75 fields; expected 82' for a Mooncake file read as azure) without
saying which format it is."""

from __future__ import annotations

import csv
from pathlib import Path

from traces.formats import azure, burstgpt, vidur
from traces.formats.sharegpt import MESSAGE_LIST_KEYS
from traces.formats.tabular import READ_ERRORS, open_text

HEAD_CHARS = 1 << 16  # enough for any header or the start of a JSON record; a minified ShareGPT file is one line

# The columns that name each CSV format, all of which its header holds.
CSV_SIGNATURES = {
    "azure": azure.REQUIRED_COLUMNS,
    "burstgpt": burstgpt.REQUIRED_COLUMNS,
    "vidur": vidur.REQUIRED_COLUMNS,
}
MOONCAKE_KEYS = ('"input_length"', '"output_length"')  # hash_ids too, in the published traces; optional to convert


def _head(path: Path) -> str:
    """The first HEAD_CHARS characters without leading blanks, '' when the source cannot be read as text."""
    if not path.is_file():  # a FIFO blocks a read forever
        return ""
    try:
        with open_text(path) as handle:
            return handle.read(HEAD_CHARS).lstrip()
    except (*READ_ERRORS, ValueError):
        return ""


def guess_format(path: Path) -> tuple[str, str] | None:
    """(format, what gave it away) for the format the start of the source looks like, or None."""
    head = _head(path)
    if head.startswith(("{", "[")):  # a pretty-printed ShareGPT list opens with '[' alone on its line
        if all(key in head for key in MOONCAKE_KEYS):
            keys = "input_length, output_length and hash_ids" if '"hash_ids"' in head else \
                "input_length and output_length"
            return "mooncake", f"JSON records with {keys}"
        key = next((key for key in MESSAGE_LIST_KEYS if f'"{key}"' in head), None)
        if key:
            return "sharegpt", f"JSON conversations with {key!r}"
        return None
    try:
        names = {name.strip() for name in next(csv.reader(head.splitlines()[:1]), [])}
    except csv.Error:
        return None
    for fmt, columns in CSV_SIGNATURES.items():
        if set(columns) <= names:
            return fmt, f"a CSV header with {', '.join(columns)}"
    return None


def with_format_hint(message: str, fmt: str, path: Path) -> str:
    """`message`, followed by the format the source looks like when that is another than `fmt`."""
    guess = guess_format(path)
    if guess is None or guess[0] == fmt:
        return message
    other, evidence = guess
    article = "an" if other[0] in "aeiou" else "a"
    return (f"{message}; it looks like {article} {other} trace ({evidence}): python -m traces.convert {other} {path} "
            "-o OUT")
