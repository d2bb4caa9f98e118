"""The converters on tiny files laid out exactly as the public datasets publish them (column names and order, time
formats and units, line endings, compression, the rows a real file holds), and on hostile input beside them.

Layouts as published:
- Azure 2023 (AzurePublicDataset data/AzureLLMInferenceTrace_{code,conv}.csv): CRLF, no newline after the last row,
  times with 7 fractional digits;
- Azure 2024 (AzureLLMInferenceTrace_{code,conv}_1week.csv): times with offsets, and no fraction on a whole second
  ('2024-05-12 00:00:00+00:00' beside '2024-05-12 00:00:00.001163+00:00');
- Azure 2025 multimodal (data/AzureLMMInferenceTrace_multimodal.csv.gz): gzip'd, `TIMESTAMP,NumImages,ContextTokens,
  GeneratedTokens`, times like '2024-10-15T12:00:00.269Z';
- BurstGPT_1/_2: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`, failures with 0 response
  tokens; BurstGPT_3 (release v1.2): `Timestamp,Session ID,Elapsed time,...`, float seconds from 19440110.0, an empty
  Session ID on every API log row;
- Mooncake FAST'25 traces (conversation, toolagent, synthetic) and the arXiv trace: JSON lines of timestamp (ms),
  input_length, output_length, hash_ids of 512-token blocks, several requests at one timestamp;
- ShareGPT V3 unfiltered (conversations of from/value, empty conversations, conversations opening with the model),
  OpenChat's sharegpt_gpt4.json (`items`), chat-style `messages` of role/content, LLaMA-Factory's function calling,
  JSON Lines mirrors;
- Vidur data/processed_traces: splitwise_{conv,code}.csv (`arrived_at,num_prefill_tokens,num_decode_tokens`) and
  arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv (`num_prefill_tokens,num_decode_tokens,num_total_tokens,
  pd_ratio`, no times).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path

import polars as pl
import pytest

from tests.traces.helpers import cli_error, word_ids
from traces import TraceError, load_trace
from traces.convert import convert
from traces.convert import main as convert_main
from traces.formats import ConvertOptions


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _rows(trace) -> list[tuple]:
    return trace.requests.select("request_id", "arrival_s", "prompt_tokens", "output_tokens").rows()


# --- Azure ----------------------------------------------------------------------------------------------------

def test_azure_2023_layout_crlf_without_a_last_newline(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
            "2023-11-16 18:17:03.9799600,4808,10\r\n"
            "2023-11-16 18:17:04.0319600,3180,8\r\n"
            "2023-11-16 18:17:03.9799601,110,27")  # out of order by 100 ns, and no CRLF after the last row
    trace, dropped = convert("azure", _write(tmp_path / "AzureLLMInferenceTrace_code.csv", text))
    assert _rows(trace) == [(0, 0.0, 4808, 10), (2, 1e-7, 110, 27), (1, 0.052, 3180, 8)]
    assert dropped == ""


def test_azure_2024_layout_whole_seconds_and_offsets(tmp_path: Path) -> None:
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2024-05-12 00:00:00.001163+00:00,1452,3\n"
            "2024-05-12 00:00:00+00:00,584,3\n"  # a whole second is written without a fraction
            "2024-05-12 02:00:01+02:00,862,38\n"  # the same instant as 00:00:01 UTC
            "2024-05-12 00:00:01.500000+00:00,617,0\n")  # 0 generated tokens: dropped and counted
    trace, dropped = convert("azure", _write(tmp_path / "AzureLLMInferenceTrace_conv_1week.csv", text))
    assert _rows(trace) == [(1, 0.0, 584, 3), (0, 0.001163, 1452, 3), (2, 1.0, 862, 38)]
    assert dropped == "dropped 1 request with 0 prompt or 0 output tokens"


def test_azure_2025_multimodal_gzip_keeps_the_image_count(tmp_path: Path) -> None:
    text = ("TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
            "2024-10-15T12:00:00.269Z,0,770,491\n"
            "2024-10-15T12:00:05.819Z,1,949,126\n"
            "2024-10-15T12:00:06Z,16,4564,137\n")
    source = _write(tmp_path / "AzureLMMInferenceTrace_multimodal.csv.gz", gzip.compress(text.encode()))
    trace, _ = convert("azure", source)
    assert _rows(trace) == [(0, 0.0, 770, 491), (1, 5.55, 949, 126), (2, 5.731, 4564, 137)]
    assert trace.requests["num_images"].to_list() == [0, 1, 16]
    out = tmp_path / "mm.parquet"
    assert convert_main(["azure", str(source), "-o", str(out)]) == 0
    assert load_trace(out).requests["num_images"].dtype == pl.Int64


def test_a_small_gzipd_csv_is_not_taken_for_one_of_cr_lines(tmp_path: Path) -> None:
    """The line-ending check read a gzip'd file's compressed bytes: about one small gzip'd CSV in four holds a CR
    byte and no LF byte there, and was refused as 'its lines end in a bare carriage return'."""
    header = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n"
    for images in range(1000):  # a file whose compressed bytes hold a CR and no LF
        text = header + f"2024-10-15T12:00:00.269Z,{images},770,491\n"
        packed = gzip.compress(text.encode(), mtime=0)
        if b"\r" in packed.rstrip(b"\r") and b"\n" not in packed:
            break
    else:
        pytest.skip("no small gzip'd CSV here holds a CR byte and no LF byte")
    trace, _ = convert("azure", _write(tmp_path / "t.csv.gz", packed))
    assert _rows(trace) == [(0, 0.0, 770, 491)] and trace.requests["num_images"].to_list() == [images]


def test_azure_quoted_reordered_columns_with_a_pandas_index_and_a_bom(tmp_path: Path) -> None:
    text = ('\ufeff,"GeneratedTokens","TIMESTAMP","ContextTokens"\n'
            '0,"44","2023-11-16 18:15:46.6805900","374"\n'
            '1,"109","2023-11-16 18:15:50.9951690","396"\n\n\n')
    trace, _ = convert("azure", _write(tmp_path / "azure.csv", text))
    assert _rows(trace) == [(0, 0.0, 374, 44), (1, 4.314579, 396, 109)]


# --- BurstGPT ---------------------------------------------------------------------------------------------------

def test_burstgpt_1_layout_drops_failures(tmp_path: Path) -> None:
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"
            "5,ChatGPT,472,18,490,Conversation log\r\n"
            "45,ChatGPT,1087,0,1087,Conversation log\r\n"  # a failure: 0 response tokens
            "118,GPT-4,417,505,922,API log\r\n")
    trace, dropped = convert("burstgpt", _write(tmp_path / "BurstGPT_1.csv", text))
    assert _rows(trace) == [(0, 0.0, 472, 18), (2, 113.0, 417, 505)]
    assert trace.requests["model"].to_list() == ["ChatGPT", "GPT-4"]
    assert "session_id" not in trace.requests.columns
    assert dropped == "dropped 1 request (0 response tokens are failures) with 0 prompt or 0 output tokens"


BURSTGPT_3 = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "19440110.0,1722ac82-0a46-4bf0-aa08-89794e7a2b3f,43,GPT-4,906,446,1352,Conversation log\n"
    "19440161.0,,2,ChatGPT,36,29,65,API log\n"
    "19440192.0,1722ac82-0a46-4bf0-aa08-89794e7a2b3f,8,GPT-4,1779,123,1902,Conversation log\n"
    "19440254.0,,,ChatGPT,935,0,935,API log\n"  # a failure, and no elapsed time
    "19440260.5,,3,ChatGPT,12,7,19,API log\n"
)


def test_burstgpt_3_keeps_sessions_and_elapsed_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "BurstGPT_3.csv", BURSTGPT_3)
    trace, dropped = convert("burstgpt", source)
    assert _rows(trace) == [(0, 0.0, 906, 446), (1, 51.0, 36, 29), (2, 82.0, 1779, 123), (4, 150.5, 12, 7)]
    session = "1722ac82-0a46-4bf0-aa08-89794e7a2b3f"
    assert trace.requests["session_id"].to_list() == [session, None, session, None]
    assert trace.requests["elapsed_s"].to_list() == [43.0, 2.0, 8.0, 3.0]
    assert dropped == "dropped 1 request (0 response tokens are failures) with 0 prompt or 0 output tokens"
    assert convert_main(["burstgpt", str(source), "-o", str(tmp_path / "b.parquet")]) == 0
    assert ", 3 sessions, " in capsys.readouterr().out  # each API call is a session of its own


def test_burstgpt_3_bad_elapsed_time_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "b.csv", BURSTGPT_3.replace(",,2,ChatGPT", ",,abc,ChatGPT"))
    line = cli_error(convert_main, ["burstgpt", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == f"error: {source}: line 3: field 'Elapsed time' is 'abc'; expected a finite number or nothing"


# --- Mooncake ---------------------------------------------------------------------------------------------------

def _record(timestamp: object, input_length: object, output_length: object, hash_ids: list[int]) -> str:
    return json.dumps({"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
                       "hash_ids": hash_ids})


def test_mooncake_fast25_layout_gzip_with_trailing_blank_lines(tmp_path: Path) -> None:
    lines = [_record(0, 6755, 500, list(range(14))), _record(0, 7319, 490, [0, *range(14, 28)]),
             _record(3052, 2287, 316, [0, 42, 43, 44, 45]), _record(27482, 512, 0, [46])]  # 0 output: dropped
    source = _write(tmp_path / "toolagent_trace.jsonl.gz", gzip.compress(("\n".join(lines) + "\n\n\n").encode()))
    trace, dropped = convert("mooncake", source)
    assert _rows(trace) == [(0, 0.0, 6755, 500), (1, 0.0, 7319, 490), (2, 3.052, 2287, 316)]
    assert trace.requests["hash_ids"].to_list()[2] == [0, 42, 43, 44, 45]
    assert trace.hash_block_size == 512
    assert dropped == "dropped 1 request with 0 prompt or 0 output tokens"


def test_mooncake_whole_float_lengths_are_integers(tmp_path: Path) -> None:
    """pandas writes an integer column that held a missing value as floats: 6955.0 says 6955."""
    source = _write(tmp_path / "m.jsonl", _record(27482.0, 6955.0, 52.0, list(range(14))) + "\n"
                    + _record(30535, 6472, 26, list(range(13))) + "\n")
    trace, _ = convert("mooncake", source)
    assert _rows(trace) == [(0, 0.0, 6955, 52), (1, 3.053, 6472, 26)]


@pytest.mark.parametrize(("length", "shown"), [(10.5, "10.5"), (-3, "-3"), ("10", "'10'"), (True, "True")])
def test_mooncake_bad_lengths_name_the_line(tmp_path: Path, length: object, shown: str) -> None:
    source = _write(tmp_path / "m.jsonl", _record(0, 10, 5, [0]) + "\n" + _record(1, length, 5, [0]) + "\n")
    with pytest.raises(TraceError) as info:
        convert("mooncake", source)
    assert str(info.value) == (f"{source}: line 2: field 'input_length' is {shown}; expected an integer from 0 to "
                               "2**63 - 1")


def test_mooncake_as_a_json_array_says_so(tmp_path: Path) -> None:
    source = _write(tmp_path / "m.json", json.dumps([json.loads(_record(0, 10, 5, [0]))], indent=2))
    with pytest.raises(TraceError) as info:
        convert("mooncake", source)
    assert str(info.value) == (f"{source}: line 1: not valid JSON (Expecting value at column 1); the file is a JSON "
                               "array, expected one JSON object per line (JSON Lines)")


# --- ShareGPT ---------------------------------------------------------------------------------------------------

V3 = [
    {"id": "QWJhYvA_0", "conversations": [
        {"from": "human", "value": "hello world"}, {"from": "gpt", "value": "how are you"},
        {"from": "human", "value": "fine thanks"}, {"from": "gpt", "value": "what is a trace"}]},
    {"id": "QWJhYvA_1", "conversations": []},  # empty, as some are in the V3 file
    {"id": "dsOTKpn_0", "conversations": [  # opens with the model; its last answer is empty
        {"from": "gpt", "value": "hello"}, {"from": "human", "value": "what"}, {"from": "gpt", "value": "fine"},
        {"from": "human", "value": "and you"}, {"from": "gpt", "value": ""}]},
    {"id": "i6IyJda_0", "conversations": [  # a system message, two human messages in a row, other model names
        {"from": "system", "value": "you are a trace"}, {"from": "human", "value": "hello"},
        {"from": "human", "value": "world"}, {"from": "bing", "value": "fine"}, {"from": "human", "value": "and"}]},
]


def _options(tokenizer: Path, **kw: object) -> ConvertOptions:
    return ConvertOptions(**{"tokenizer": str(tokenizer), "qps": 2.0, "seed": 1, **kw})


def _requests(trace) -> list[tuple]:
    """(session, turn, prompt ids, output tokens) in file order."""
    frame = trace.requests.sort("request_id")
    return list(zip(frame["session_id"], frame["turn"], frame["prompt_token_ids"].to_list(), frame["output_tokens"]))


V3_REQUESTS = [
    ("QWJhYvA_0", 0, word_ids("hello world"), 3),
    ("QWJhYvA_0", 1, word_ids("hello world how are you fine thanks"), 4),
    ("dsOTKpn_0", 0, word_ids("hello what"), 1),
    ("i6IyJda_0", 0, word_ids("you are a trace hello world"), 1),
]


def test_sharegpt_v3_layout(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    trace, dropped = convert("sharegpt", _write(tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json",
                                                json.dumps(V3, indent=2)), _options(tiny_tokenizer_dir))
    assert _requests(trace) == V3_REQUESTS
    assert dropped == "dropped 1 turn whose prompt or answer has 0 tokens"


def test_sharegpt_json_lines_with_bom_crlf_and_blank_lines(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    text = "\ufeff" + "\r\n".join(json.dumps(item) for item in V3) + "\r\n\r\n"
    trace, _ = convert("sharegpt", _write(tmp_path / "sharegpt.jsonl", text), _options(tiny_tokenizer_dir))
    assert _requests(trace) == V3_REQUESTS


def test_sharegpt_json_lines_errors_name_the_line(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    lines = [json.dumps(V3[0]), "", json.dumps({"id": "x", "conversations": [{"from": "robot", "value": "hi"}]})]
    source = _write(tmp_path / "sg.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(TraceError) as info:
        convert("sharegpt", source, _options(tiny_tokenizer_dir))
    assert str(info.value).startswith(f"{source}: line 3: conversation 1 (id 'x'), message 0: field 'from' is 'robot'; "
                                      "expected 'human' or 'gpt'")
    _write(source, json.dumps(V3[0]) + "\n" + '{"id": "y", "conversations": [\n')
    with pytest.raises(TraceError, match=rf"^{source}: line 2: not valid JSON \("):
        convert("sharegpt", source, _options(tiny_tokenizer_dir))


def test_sharegpt_openchat_items(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """OpenChat's sharegpt_gpt4.json keeps the messages under 'items' (and has no ids)."""
    data = [{"items": V3[0]["conversations"], "system": "", "model": "Model: GPT-4"}]
    trace, _ = convert("sharegpt", _write(tmp_path / "sharegpt_gpt4.json", json.dumps(data)),
                       _options(tiny_tokenizer_dir))
    assert _requests(trace) == [("0", turn, ids, out) for _, turn, ids, out in V3_REQUESTS[:2]]


def test_sharegpt_chat_style_messages(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    data = [{"id": "u1", "messages": [
        {"role": "system", "content": "a trace"}, {"role": "USER", "content": "hello"},
        {"role": "Assistant", "content": "fine thanks"}, {"role": "user", "content": "what is a trace"},
        {"role": "assistant", "content": None}]}]  # an assistant turn that only called tools: an empty answer
    trace, dropped = convert("sharegpt", _write(tmp_path / "chat.json", json.dumps(data)),
                             _options(tiny_tokenizer_dir))
    assert _requests(trace) == [("u1", 0, word_ids("a trace hello"), 2)]
    assert dropped == "dropped 1 turn whose prompt or answer has 0 tokens"


def test_sharegpt_llama_factory_function_calls(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    """The tool's result (observation) is answered by the model: a request of its own, with the call in its prompt."""
    data = [{"conversations": [
        {"from": "human", "value": "what is a trace"}, {"from": "function_call", "value": "a trace"},
        {"from": "observation", "value": "hello world"}, {"from": "gpt", "value": "fine"}],
        "system": "you are fine", "tools": "[]"}]
    trace, _ = convert("sharegpt", _write(tmp_path / "lf.json", json.dumps(data)), _options(tiny_tokenizer_dir))
    assert _requests(trace) == [
        ("0", 0, word_ids("you are fine what is a trace"), 2),
        ("0", 1, word_ids("you are fine what is a trace a trace hello world"), 1),
    ]


def test_sharegpt_empty_file_says_so(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    source = _write(tmp_path / "sg.json", "\n  \n")
    with pytest.raises(TraceError) as info:
        convert("sharegpt", source, _options(tiny_tokenizer_dir))
    assert str(info.value) == f"{source}: the file is empty; expected a JSON list of conversations or JSON Lines"


# --- Vidur ------------------------------------------------------------------------------------------------------

def test_vidur_splitwise_layout(tmp_path: Path) -> None:
    text = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.314579,396,109\n4.541877,879,55\n"
    trace, _ = convert("vidur", _write(tmp_path / "splitwise_conv.csv", text))
    assert _rows(trace) == [(0, 0.0, 374, 44), (1, 4.314579, 396, 109), (2, 4.541877, 879, 55)]


def test_vidur_length_only_layout(tmp_path: Path) -> None:
    text = ("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
            "3772,54,3826,69.85185185185185\n2015,156,2171,12.916666666666666\n")
    source = _write(tmp_path / "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", text)
    trace, _ = convert("vidur", source)
    assert _rows(trace) == [(0, 0.0, 3772, 54), (1, 0.0, 2015, 156)]
    drawn, _ = convert("vidur", source, ConvertOptions(qps=4.0, seed=3))
    assert drawn.requests["arrival_s"][0] == 0.0 and drawn.requests["arrival_s"][1] > 0


# --- hostile input --------------------------------------------------------------------------------------------

def _zip(name: str, text: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, text)
    return buffer.getvalue()


def _tar_gz(name: str, text: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(text)
        archive.addfile(info, io.BytesIO(text.encode()))
    return buffer.getvalue()


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
MOONCAKE = _record(0, 10, 5, [0]) + "\n"


@pytest.mark.parametrize(("fmt", "name", "data", "expected"), [
    # polars named no line ('invalid utf-8 sequence'); the JSON reader's offset counted from its chunk
    ("burstgpt", "latin1.csv", (b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                                b"5,ChatGPT,472,18,490,Conversation log\n6,Chat\xe9,1,1,2,API log\n"),
     "{src}: line 3: cannot read: not UTF-8 text (byte e9 at offset 113); expected UTF-8 text, plain or compressed "
     "with gzip, zstd, bz2 or xz (iconv -f WINDOWS-1252 -t UTF-8 converts Windows text)"),
    ("mooncake", "late.jsonl", MOONCAKE.encode() * 3000 + b'{"x": "\xe9"}\n',
     "{src}: line 3001: cannot read: not UTF-8 text (byte e9 at offset 222007); expected UTF-8 text, plain or "
     "compressed with gzip, zstd, bz2 or xz (iconv -f WINDOWS-1252 -t UTF-8 converts Windows text)"),
    # archives were read as text: a zip 'ends its lines in a bare carriage return', a .tar.gz had '1 fields'
    ("azure", "t.zip", _zip("azure.csv", AZURE),
     "{src}: cannot read: a zip archive (unzip it first); expected a CSV file"),
    ("vidur", "t.tar.gz", _tar_gz("v.csv", "num_prefill_tokens,num_decode_tokens\n1,2\n"),
     "{src}: cannot read: a tar archive (extract it first: tar xf); expected a CSV file"),
    ("mooncake", "t.zip", _zip("m.jsonl", MOONCAKE),
     "{src}: cannot read: a zip archive (unzip it first); expected a Mooncake JSONL file"),
    # another format's file: named as what it looks like
    ("azure", "m.jsonl", MOONCAKE.encode(),
     "{src}: cannot read: JSON, not CSV (it starts with '{{'); expected a CSV file with a header line; it looks like "
     "a mooncake trace (JSON records with input_length, output_length and hash_ids): python -m traces.convert "
     "mooncake {src} -o OUT"),
    ("vidur", "a.csv", AZURE.encode(),
     "{src}: missing column(s) 'num_prefill_tokens', 'num_decode_tokens' in the header; found ['TIMESTAMP', "
     "'ContextTokens', 'GeneratedTokens']; expected num_prefill_tokens, num_decode_tokens (and optionally "
     "arrived_at); it looks like an azure trace (a CSV header with TIMESTAMP, ContextTokens, GeneratedTokens): "
     "python -m traces.convert azure {src} -o OUT"),
    ("mooncake", "a.csv", AZURE.encode(),
     "{src}: line 1: not valid JSON (Expecting value at column 1); the line reads like a CSV header "
     "('TIMESTAMP,ContextTokens,GeneratedTokens'), expected one JSON object per line (JSON Lines); it looks like an "
     "azure trace (a CSV header with TIMESTAMP, ContextTokens, GeneratedTokens): python -m traces.convert azure {src} "
     "-o OUT"),
    ("azure", "semi.csv", b"TIMESTAMP;ContextTokens;GeneratedTokens\n2023-11-16 18:15:46;1;1\n",
     "{src}: missing column(s) 'TIMESTAMP', 'ContextTokens', 'GeneratedTokens' in the header; found "
     "['TIMESTAMP;ContextTokens;GeneratedTokens'] (its fields are separated by ';', not commas); expected TIMESTAMP, "
     "ContextTokens, GeneratedTokens (and optionally NumImages)"),
    ("vidur", "empty.csv", b"", "{src}: the file is empty; expected a CSV file with a header line"),
    ("vidur", "blank.csv.gz", gzip.compress(b"\n\n"),
     "{src}: the file is empty; expected a CSV file with a header line"),
], ids=["latin1-csv", "latin1-jsonl", "zip-csv", "tar-gz-csv", "zip-jsonl", "jsonl-as-azure", "azure-as-vidur",
        "azure-as-mooncake", "semicolons", "empty", "blank-gzip"])
def test_hostile_sources_are_one_line_and_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str,
                                                       name: str, data: bytes, expected: str) -> None:
    source = _write(tmp_path / name, data)
    out = tmp_path / "out.parquet"
    line = cli_error(convert_main, [fmt, str(source), "-o", str(out)], capsys)
    assert line == "error: " + expected.format(src=source)
    assert not out.exists() and source.read_bytes() == data


def test_a_parquet_trace_given_as_a_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "azure.csv", AZURE)
    trace = tmp_path / "t.parquet"
    assert convert_main(["azure", str(source), "-o", str(trace)]) == 0
    before = trace.read_bytes()
    line = cli_error(convert_main, ["mooncake", str(trace), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == (f"error: {trace}: cannot read: a parquet file (already a trace? python -m traces.info reads one); "
                    "expected a Mooncake JSONL file")
    line = cli_error(convert_main, ["azure", str(source), "-o", str(source), "--overwrite"], capsys)
    assert line == f"error: -o {source} is the source trace; write the parquet elsewhere"
    assert trace.read_bytes() == before and source.read_text() == AZURE


@pytest.mark.parametrize(("args", "expected"), [
    (["--limit", "0"], "--limit must be >= 1"),
    (["--limit", "-1"], "--limit must be >= 1"),
    (["--qps", "0"], "--qps must be a finite number > 0, got 0.0"),
    (["--qps", "nan"], "--qps must be a finite number > 0, got nan"),
    (["--qps", "-2"], "--qps must be a finite number > 0, got -2.0"),
])
def test_bad_options_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                   expected: str) -> None:
    source = _write(tmp_path / "azure.csv", AZURE)
    out = tmp_path / "o.parquet"
    line = cli_error(convert_main, ["azure", str(source), "-o", str(out), *args], capsys)
    assert line == f"error: {expected} (--help lists the options)"
    assert not out.exists()


@pytest.mark.parametrize(("fmt", "name", "text", "expected"), [
    ("azure", "a.csv", AZURE + "2023-11-16 18:15:47.0,-5,3\n", "line 3: field 'ContextTokens' is -5; expected an "
     "integer >= 0"),
    ("burstgpt", "b.csv", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
     "5,ChatGPT,472,nan,490,Conversation log\n", "line 2: field 'Response tokens' is 'nan'; expected an integer"),
    ("vidur", "v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\nnan,1,2\n",
     "line 2: field 'arrived_at' is 'nan'; expected a finite number"),
    ("mooncake", "m.jsonl", '{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n',
     "line 1: field 'timestamp' is nan; expected milliseconds from 0 to 1e+15"),
])
def test_negative_and_nan_values_name_the_line(tmp_path: Path, fmt: str, name: str, text: str, expected: str) -> None:
    source = _write(tmp_path / name, text)
    with pytest.raises(TraceError) as info:
        convert(fmt, source)
    assert str(info.value) == f"{source}: {expected}"


def test_a_directory_or_an_unknown_format(tmp_path: Path, tiny_tokenizer_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    line = cli_error(convert_main, ["sharegpt", str(tmp_path), "-o", str(tmp_path / "o.parquet"), "--tokenizer",
                                    str(tiny_tokenizer_dir), "--qps", "1"], capsys)
    assert line == f"error: {tmp_path}: cannot read: it is a directory; expected a ShareGPT JSON file"
    line = cli_error(convert_main, ["mooncake", str(tmp_path), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == f"error: {tmp_path}: cannot read: it is a directory; expected a Mooncake JSONL file"
    line = cli_error(convert_main, ["splitwise", str(tmp_path), "-o", str(tmp_path / "o.parquet")], capsys)
    assert "invalid choice: 'splitwise'" in line
