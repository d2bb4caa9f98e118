"""Fifty-first session, helper B: public trace variants the converters refused or misread.

A Mooncake-layout file without hash ids (the key absent, null or an empty list: the length-only records that other
benchmark tools write and accept) was refused as "field 'hash_ids' is missing"; it converts now, without hash ids,
and says so in the summary line. A file that gives ids for some prompts and none for others is refused at the first
record that breaks the pattern, naming both lines.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.traces.helpers import cli_error, word_ids
from traces import TraceError, load_trace
from traces.convert import convert
from traces.convert import main as convert_main
from traces.formats import ConvertOptions


def _jsonl(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "lengths.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


@pytest.mark.parametrize("absent", [{}, {"hash_ids": None}, {"hash_ids": []}])
def test_mooncake_without_hash_ids_converts_without_them(tmp_path: Path, absent: dict) -> None:
    records = [{"timestamp": 2500, "input_length": 700, "output_length": 3, **absent},
               {"timestamp": 1000, "input_length": 0, "output_length": 9, **absent},
               {"timestamp": 1000, "input_length": 40, "output_length": 1, **absent}]
    trace, note = convert("mooncake", _jsonl(tmp_path, records))
    assert trace.hash_block_size is None
    assert trace.requests.columns == ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    assert trace.requests["request_id"].to_list() == [2, 0]
    assert trace.requests["arrival_s"].to_list() == [0.0, 1.5]
    assert trace.requests["prompt_tokens"].to_list() == [40, 700]
    assert note == ("no hash_ids in the file (prompts share no prefix), "
                    "dropped 1 request with 0 prompt or 0 output tokens")


def test_mooncake_without_hash_ids_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _jsonl(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 2},
                               {"timestamp": 500, "input_length": 20, "output_length": 4}])
    out = tmp_path / "t.parquet"
    assert convert_main(["mooncake", str(source), "-o", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"wrote 2 requests to {out}: span 0.500 s (2.000 req/s), mean prompt 15.0 tokens, mean output 3.0 tokens, "
        "no hash_ids in the file (prompts share no prefix)\n")
    trace = load_trace(out)
    assert trace.hash_block_size is None and "hash_ids" not in trace.requests.columns


def test_mooncake_with_hash_ids_is_unchanged(tmp_path: Path) -> None:
    """A prompt of 0 tokens gives no ids either way; the others' ids are kept, and no note is added."""
    records = [{"timestamp": 0, "input_length": 0, "output_length": 1},
               {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [7, 8]}]
    trace, note = convert("mooncake", _jsonl(tmp_path, records))
    assert trace.hash_block_size == 512
    assert trace.requests["hash_ids"].to_list() == [[7, 8]]
    assert note == "dropped 1 request with 0 prompt or 0 output tokens"


@pytest.mark.parametrize(("second", "message"), [
    ({"hash_ids": []}, "line 3: field 'hash_ids' is missing or empty, while line 1 (the first prompt) gives ids"),
    ({}, "line 3: field 'hash_ids' is missing or empty, while line 1 (the first prompt) gives ids"),
])
def test_mooncake_hash_ids_for_some_prompts_only_are_refused(tmp_path: Path, second: dict, message: str) -> None:
    records = [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]},
               {"timestamp": 1, "input_length": 0, "output_length": 1},
               {"timestamp": 2, "input_length": 10, "output_length": 1, **second}]
    path = _jsonl(tmp_path, records)
    with pytest.raises(TraceError) as error:
        convert("mooncake", path)
    assert str(error.value) == (f"{path}: {message}; expected hash ids for every prompt of tokens or for none")


def test_mooncake_ids_after_prompts_without_them_are_refused(tmp_path: Path, capsys) -> None:
    source = _jsonl(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []},
                               {"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [4]}])
    out = tmp_path / "t.parquet"
    assert cli_error(convert_main, ["mooncake", str(source), "-o", str(out)], capsys) == (
        f"error: {source}: line 2: field 'hash_ids' gives ids, while line 1 (the first prompt) gives none; expected "
        "hash ids for every prompt of tokens or for none")
    assert not out.exists()


def test_hashless_mooncake_given_as_another_format_is_named(tmp_path: Path, capsys) -> None:
    source = _jsonl(tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1}])
    line = cli_error(convert_main, ["vidur", str(source), "-o", str(tmp_path / "t.parquet")], capsys)
    assert line.endswith(f"; it looks like a mooncake trace (JSON records with input_length and output_length): "
                         f"python -m traces.convert mooncake {source} -o OUT")


def test_azure_offsets_of_hours_alone_are_honoured(tmp_path: Path) -> None:
    """PostgreSQL writes a timestamptz with an offset of hours alone ("+00"): such a re-export of the 2024 trace was
    read as zoneless and refused with the 2023 example ('expected a time like 2023-11-16 18:15:46.6805900')."""
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.00993+00,10,5\n"
                    "2024-05-10 05:00:01+05,11,5\n2024-05-09 20:30:02-0330,12,5\n")
    trace, _ = convert("azure", path)
    assert trace.requests["arrival_s"].to_list() == [0.0, 0.99007, 1.99007]
    assert trace.requests["prompt_tokens"].to_list() == [10, 11, 12]


def _sharegpt(tmp_path: Path, messages: list[dict]) -> Path:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps([{"id": "s", "messages": messages}]))
    return path


def test_sharegpt_content_of_text_parts_is_read(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """OpenAI-style content lists were refused as "field 'content' is list; expected a string"; their text parts are
    the message, joined by newlines (which the word tokenizer splits on, as on spaces)."""
    parts = [{"type": "text", "text": "hello world"}, {"type": "text", "text": "how are you"}]
    path = _sharegpt(tmp_path, [{"role": "system", "content": [{"type": "text", "text": "fine"}]},
                                {"role": "user", "content": parts},
                                {"role": "assistant", "content": [{"type": "text", "text": "thanks and you"}]},
                                {"role": "user", "content": []},  # no text, as "": the prompt is the history
                                {"role": "assistant", "content": "fine"}])
    options = ConvertOptions(tokenizer=str(tiny_tokenizer_dir), qps=1.0)
    trace, note = convert("sharegpt", path, options)
    assert trace.requests["prompt_token_ids"].to_list() == [word_ids("fine hello world how are you"),
                                                            word_ids("fine hello world how are you thanks and you")]
    assert trace.requests["output_tokens"].to_list() == [3, 1]
    assert note == ""
    two, _ = convert("sharegpt", _sharegpt(tmp_path, [{"role": "user", "content": "hello world\nhow are you"},
                                                     {"role": "assistant", "content": "thanks and you"}]), options)
    assert two.requests["prompt_token_ids"].to_list() == [word_ids("hello world how are you")]


@pytest.mark.parametrize(("part", "what"), [
    ({"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "of type 'image_url'"),
    ("hello", "a JSON string"),
    ({"type": "text", "text": 5}, "a text part whose 'text' is no string"),
])
def test_sharegpt_content_parts_that_are_no_text_are_refused(tmp_path: Path, tiny_tokenizer_dir: Path, part,
                                                              what: str) -> None:
    path = _sharegpt(tmp_path, [{"role": "user", "content": [{"type": "text", "text": "hello"}, part]},
                                {"role": "assistant", "content": "fine"}])
    with pytest.raises(TraceError) as error:
        convert("sharegpt", path, ConvertOptions(tokenizer=str(tiny_tokenizer_dir), qps=1.0))
    assert str(error.value) == (
        f"{path}: conversation 0 (id 's'), message 0: field 'content' is a list whose part 1 is {what}; expected a "
        "string, or a list of {'type': 'text', 'text': ...} parts (images and other media are not simulated)")


def test_mooncake_hash_block_size_for_traces_of_other_blocks(tmp_path: Path, capsys) -> None:
    """A trace synthesized in the Mooncake layout with 64-token blocks could not be converted at all ('has 3 ids but
    input_length 150 needs ceil(150/512) = 1'); --hash-block-size 64 keeps its ids with that block size."""
    source = _jsonl(tmp_path, [{"timestamp": 0, "input_length": 150, "output_length": 3, "hash_ids": [0, 1, 2]},
                               {"timestamp": 100, "input_length": 130, "output_length": 3, "hash_ids": [0, 1, 5]}])
    out = tmp_path / "t.parquet"
    assert cli_error(convert_main, ["mooncake", str(source), "-o", str(out)], capsys) == (
        f"error: {source}: line 1: field 'hash_ids' has 3 ids but input_length 150 needs ceil(150/512) = 1 (a trace "
        "of blocks of another size converts with --hash-block-size N)")
    assert convert_main(["mooncake", str(source), "-o", str(out), "--hash-block-size", "64"]) == 0
    trace = load_trace(out)
    assert trace.hash_block_size == 64
    assert trace.requests["hash_ids"].to_list() == [[0, 1, 2], [0, 1, 5]]
    first, second = (trace.prompt_token_ids(row, 1000) for row in (0, 1))
    assert first[:128] == second[:128] and first[128:130] != second[128:130]  # two shared blocks of 64, then not
    with pytest.raises(TraceError, match=r"has 3 ids but input_length 150 needs ceil\(150/100\) = 2$"):
        convert("mooncake", source, ConvertOptions(hash_block_size=100))


@pytest.mark.parametrize(("argv", "expected"), [
    (["azure", "--hash-block-size", "64"], "error: --hash-block-size only applies to the mooncake format (its "
     "hash_ids name blocks of prompt tokens); azure traces have no hash_ids (--help lists the options)"),
    (["mooncake", "--hash-block-size", "0"], "error: --hash-block-size must be an integer from 1 to 2147483648, "
     "got 0 (--help lists the options)"),
])
def test_hash_block_size_is_refused_where_it_means_nothing(tmp_path: Path, capsys, argv: list[str],
                                                           expected: str) -> None:
    source = tmp_path / "src.txt"
    source.write_text("x\n")
    out = tmp_path / "t.parquet"
    assert cli_error(convert_main, [argv[0], str(source), "-o", str(out), *argv[1:]], capsys) == expected
    assert not out.exists()


SECONDS_WARNING = ("warning: the timestamps look like seconds (fractional, median gap 0.55), but Mooncake timestamps "
                   "are milliseconds: if they are seconds, multiply them by 1000")


@pytest.mark.parametrize(("times", "warned"), [
    ([0.0, 0.4, 1.1, 1.5, 2.25], True),  # seconds: arrivals read 1,000 times closer than recorded
    ([0, 400, 1100, 1500, 2250], False),  # whole milliseconds, as the published traces
    ([0, 0, 1, 1, 2], False),  # whole milliseconds, however dense
    ([0.5, 400.25, 1100.75], False),  # fractional milliseconds far apart
])
def test_mooncake_timestamps_that_look_like_seconds_are_flagged(tmp_path: Path, times: list, warned: bool) -> None:
    records = [{"timestamp": t, "input_length": 600, "output_length": 20, "hash_ids": [2 * i, 2 * i + 1]}
               for i, t in enumerate(times)]
    trace, note = convert("mooncake", _jsonl(tmp_path, records))
    assert note == (SECONDS_WARNING if warned else "")
    assert trace.requests["arrival_s"].to_list() == [(t - times[0]) / 1000 for t in times]  # still read as ms


def test_the_seconds_warning_follows_the_hashless_note(tmp_path: Path) -> None:
    records = [{"timestamp": t, "input_length": 600, "output_length": 20} for t in (0.0, 0.4, 1.1, 1.5, 2.25)]
    _, note = convert("mooncake", _jsonl(tmp_path, records))
    assert note == f"no hash_ids in the file (prompts share no prefix), {SECONDS_WARNING}"
