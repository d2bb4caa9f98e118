"""Session 36, helper E: a --tokenizer too long to be a file name (a hub name, or a mistyped path).

``Path.exists()`` and ``is_file()`` raise OSError ("File name too long") on a name over 255 bytes:
``traces.convert sharegpt --tokenizer xxx...`` said "error: -o OUT.parquet: File name too long", blaming the output,
and ``traces.bench --prompt-format text --tokenizer xxx...`` said "error: xxx...: File name too long; expected a
path ..." without naming its option."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from cli.traces_bench import main as bench_main
from traces.convert import main as convert_main
from traces.schema import save_trace

LONG_NAME = "x" * 300

pytest.importorskip("transformers")


@pytest.fixture
def conversations(tmp_path: Path) -> Path:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]))
    return path


def test_convert_names_the_tokenizer_too_long_to_be_a_folder(tmp_path: Path, conversations: Path, capsys) -> None:
    out = tmp_path / "t.parquet"
    assert convert_main(["sharegpt", str(conversations), "-o", str(out), "--qps", "1", "--tokenizer", LONG_NAME]) == 2
    assert capsys.readouterr().err == (f"error: --tokenizer {LONG_NAME}: no such directory (nor a tokenizer of that "
                                       "name in the local Hugging Face cache); expected a tokenizer directory\n")
    assert not out.exists()


def test_convert_still_refuses_a_tokenizer_file_and_a_missing_folder(tmp_path: Path, conversations: Path,
                                                                     capsys) -> None:
    out = tmp_path / "t.parquet"
    assert convert_main(["sharegpt", str(conversations), "-o", str(out), "--qps", "1",
                         "--tokenizer", str(conversations)]) == 2
    assert capsys.readouterr().err == (f"error: --tokenizer {conversations}: is a file; expected a Hugging Face "
                                       "tokenizer directory\n")
    missing = tmp_path / "missing"
    assert convert_main(["sharegpt", str(conversations), "-o", str(out), "--qps", "1",
                         "--tokenizer", str(missing)]) == 2
    assert capsys.readouterr().err == (f"error: --tokenizer {missing}: no such directory (nor a tokenizer of that "
                                       "name in the local Hugging Face cache); expected a tokenizer directory\n")
    assert not out.exists()


def test_bench_names_the_tokenizer_too_long_to_be_a_file(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.parquet"
    save_trace(pl.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [4], "output_tokens": [2]}), trace)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        bench_main(["http://127.0.0.1:1", str(trace), "--prompt-format", "text", "--tokenizer", LONG_NAME,
                    "--vocab-size", "10", "--model", "m", "--out", str(out)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --tokenizer {LONG_NAME}: cannot load it (")
    assert err.count("\n") == 1 and "File name too long" not in err
    assert not out.exists()
