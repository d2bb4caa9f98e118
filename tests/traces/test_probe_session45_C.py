"""Session 45 (helper C) hostile-input probes of traces.convert: a field of megabytes (a lost line break, a column of
text in a count's place) was quoted whole in its one-line error, an error line of megabytes; and a conversion killed
by SIGKILL left its hidden staging file beside -o for good."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traces.convert import main as convert_main
from traces.files import staging_path
from traces.schema import save_trace

from .helpers import cli_error, dead_pid, small_frame

LONG = "9" * 1_000_000
# What an error line quotes of a value: the first 77 characters of its repr, then "..." (engine.core.messages.shown).
CUT = f"'{'9' * 76}..."
CUT_NAME = f"'{'x' * 76}..."


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("fmt", "content", "expected"),
    [
        ("azure", f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,{LONG}x\n",
         f"line 2: field 'GeneratedTokens' is {CUT}; expected an integer"),
        ("azure", f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,{'9' * 300}\n",
         f"line 2: field 'GeneratedTokens' is {'9' * 77}...; expected an integer below 2**63"),
        ("azure", f"TIMESTAMP,ContextTokens,GeneratedTokens\n{LONG},374,4\n",
         f"line 2: field 'TIMESTAMP' is {CUT}; expected a time like '2023-11-16 18:15:46.6805900'"),
        ("vidur", f"num_prefill_tokens,num_decode_tokens,arrived_at\n100,10,{LONG}x\n",
         f"line 2: field 'arrived_at' is {CUT}; expected a finite number"),
        ("mooncake", json.dumps({"timestamp": LONG, "input_length": 1, "output_length": 1, "hash_ids": [0]}) + "\n",
         f"line 1: field 'timestamp' is {CUT}; expected milliseconds from 0 to 1e+15"),
        ("mooncake", json.dumps({"timestamp": 0, "input_length": LONG, "output_length": 1, "hash_ids": [0]}) + "\n",
         f"line 1: field 'input_length' is {CUT}; expected an integer from 0 to 2**63 - 1"),
    ],
    ids=["text for a count", "digits beyond int64", "time", "number", "mooncake time", "mooncake count"],
)
def test_a_huge_field_is_quoted_cut(tmp_path, capsys, fmt, content, expected) -> None:
    source = _write(tmp_path / "source.txt", content)
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "out.parquet")], capsys)
    assert line == f"error: {source}: {expected}"
    assert not (tmp_path / "out.parquet").exists()


def test_a_huge_header_name_is_quoted_cut(tmp_path, capsys) -> None:
    source = _write(tmp_path / "source.csv", f"TIMESTAMP,ContextTokens,{'x' * 1_000_000}\n2023-11-16 18:15:46.68,1,1\n")
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "out.parquet")], capsys)
    found = str(["TIMESTAMP", "ContextTokens", "x" * 300])[:297] + "..."
    assert line == (f"error: {source}: missing column(s) 'GeneratedTokens' in the header; found {found}; expected "
                    "TIMESTAMP, ContextTokens, GeneratedTokens (and optionally NumImages)")


def test_a_huge_repeated_header_name_is_quoted_cut(tmp_path, capsys) -> None:
    name = "x" * 1_000_000
    source = _write(tmp_path / "source.csv", f"TIMESTAMP,{name},{name}\n2023-11-16 18:15:46.68,1,1\n")
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "out.parquet")], capsys)
    assert line == f"error: {source}: the header names column {CUT_NAME} more than once; expected each column once"


def test_a_huge_sharegpt_id_and_role_are_quoted_cut(tmp_path, capsys, tiny_tokenizer_dir) -> None:
    conversation = {"id": "x" * 1_000_000, "conversations": [{"from": "x" * 1_000_000, "value": "hi"}]}
    source = _write(tmp_path / "source.json", json.dumps([conversation]))
    line = cli_error(convert_main, ["sharegpt", str(source), "-o", str(tmp_path / "out.parquet"), "--qps", "1",
                                    "--tokenizer", str(tiny_tokenizer_dir)], capsys)
    assert line == (f"error: {source}: conversation 0 (id {CUT_NAME}), message 0: field 'from' is {CUT_NAME}; expected "
                    "'human' or 'gpt' (also accepted: assistant, bard, bing, chatgpt, function, function_call, model, "
                    "observation, system, tool, user)")


def test_a_trace_write_removes_the_staging_file_of_a_dead_writer(tmp_path, capsys) -> None:
    out = tmp_path / "trace.parquet"
    dead, mine = staging_path(out, "partial", dead_pid()), staging_path(out, "partial", 1)  # pid 1 always runs
    for left in (dead, mine):
        left.write_bytes(b"PAR1 half a trace")
    save_trace(small_frame(), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, out.name])
    pid = dead.name.rsplit("-", 1)[1]
    assert capsys.readouterr().err == f"note: removed {dead}, left by a writer (pid {pid}) that was killed before it " \
                                      "finished\n"
