"""Probe C (session 31): public trace variants through ``python -m traces.convert``.

What the probe found: every CSV variant tried (BOM, CRLF, quoted fields, trailing blank lines, extra and reordered
columns, gzip/zstd/xz/bz2, unsorted and repeated times, 7-digit fractions with and without zones, '12.0' counts,
0-token rows, a pandas index column) converts or is refused in one line naming the line and field. The JSON formats'
syntax errors named only json's symptom:

- JSON Lines written with a comma after each record (as a list's items are): "line 3: not valid JSON (Extra data at
  column 76)" (Mooncake), "line 1: not valid JSON (Extra data)" (ShareGPT, without even a column);
- a Mooncake record pretty-printed over several lines, as Mooncake's own FAST'25 README shows them: "line 1: not
  valid JSON (Expecting property name enclosed in double quotes at column 1)", column 1 of the line after;
- a ShareGPT list with a trailing comma before ']': "line 1: not valid JSON (Expecting value)", no column in a
  one-line (minified) file of hundreds of megabytes;
- a file cut short inside a string: "Unterminated string starting at at column 9" (json's message ends with 'at').

Expected: the same line and column, and what the slip most likely is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.traces.helpers import cli_error
from traces.convert import convert, main
from traces.errors import TraceError
from traces.formats import ConvertOptions

RECORDS = [
    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": list(range(14))},
    {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": list(range(13))},
]
CONVERSATIONS = [
    {"id": "a", "conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "fine thanks"}]},
    {"id": "b", "conversations": [{"from": "human", "value": "how are you"}, {"from": "gpt", "value": "fine"}]},
]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _error(fmt: str, source: Path, options: ConvertOptions | None = None) -> str:
    with pytest.raises(TraceError) as info:
        convert(fmt, source, options or ConvertOptions())
    return str(info.value)


def test_mooncake_json_lines_with_commas_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "m.jsonl", "".join(json.dumps(record) + ",\n" for record in RECORDS))
    out = tmp_path / "out.parquet"
    line = cli_error(main, ["mooncake", str(source), "-o", str(out)], capsys)
    column = len(json.dumps(RECORDS[0])) + 1
    assert line == (f"error: {source}: line 1: not valid JSON (Extra data at column {column}); a comma follows a "
                    "complete JSON value: JSON Lines separate records by line breaks alone (no commas), and a list "
                    "of records needs [ ] around it")
    assert not out.exists()


def test_mooncake_pretty_printed_records_say_so(tmp_path: Path) -> None:
    """The layout of the samples in Mooncake's FAST25-release/README.md."""
    source = _write(tmp_path / "m.jsonl", "".join(json.dumps(record, indent=4) + "\n" for record in RECORDS))
    assert _error("mooncake", source) == (
        f"{source}: line 1: not valid JSON (Expecting property name enclosed in double quotes at column 1); the line "
        "ends inside a JSON value: expected one whole JSON object per line (a record spread over several lines, as "
        "pretty-printed JSON writes it, or a line cut short?)")


def test_mooncake_line_cut_short(tmp_path: Path) -> None:
    text = json.dumps(RECORDS[0]) + "\n" + json.dumps(RECORDS[1])[:40] + "\n"
    message = _error("mooncake", _write(tmp_path / "m.jsonl", text))
    assert ": line 2: not valid JSON (" in message and message.endswith("or a line cut short?)")


def test_mooncake_good_lines_still_convert(tmp_path: Path) -> None:
    source = _write(tmp_path / "m.jsonl", "".join(json.dumps(record) + "\r\n" for record in RECORDS) + "\n\n")
    trace, _ = convert("mooncake", source)
    assert trace.requests["arrival_s"].to_list() == [0.0, 3.053]


def _sharegpt_options(tokenizer: Path) -> ConvertOptions:
    return ConvertOptions(tokenizer=str(tokenizer), qps=1.0)


def test_sharegpt_json_lines_with_commas_say_so(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    source = _write(tmp_path / "s.jsonl", "".join(json.dumps(item) + ",\n" for item in CONVERSATIONS))
    column = len(json.dumps(CONVERSATIONS[0])) + 1
    assert _error("sharegpt", source, _sharegpt_options(tiny_tokenizer_dir)) == (
        f"{source}: line 1: not valid JSON (Extra data at column {column}); a comma follows a complete JSON value: "
        "JSON Lines separate records by line breaks alone (no commas), and a list of records needs [ ] around it")


def test_sharegpt_trailing_comma_in_a_minified_list(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    text = json.dumps(CONVERSATIONS)[:-1] + ",]"
    source = _write(tmp_path / "s.json", text)
    assert _error("sharegpt", source, _sharegpt_options(tiny_tokenizer_dir)) == (
        f"{source}: line 1: not valid JSON (Expecting value at column {len(text)}); a comma comes before ']', which "
        "JSON does not allow; remove it")


def test_sharegpt_file_cut_short_in_a_string(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    text = json.dumps(CONVERSATIONS, indent=2)
    cut = text[: text.index("fine thanks") + 4]
    message = _error("sharegpt", _write(tmp_path / "s.json", cut), _sharegpt_options(tiny_tokenizer_dir))
    assert "starting at at" not in message
    assert message.endswith("not valid JSON (Unterminated string starting at column 18); the file ends inside a JSON "
                            "value (cut short?)")


def test_sharegpt_json_lines_still_convert(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    source = _write(tmp_path / "s.jsonl", "\ufeff" + "".join(json.dumps(item) + "\r\n\n" for item in CONVERSATIONS))
    trace, _ = convert("sharegpt", source, _sharegpt_options(tiny_tokenizer_dir))
    assert trace.requests["session_id"].to_list() == ["a", "b"]
