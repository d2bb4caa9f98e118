"""Hostile input to traces.convert, traces.synth and traces.info: exit 2 with one line naming the file, line or
option, never a traceback or a hang, and nothing written where it should not be."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.traces.helpers import REPO_ROOT, cli_error
from traces import load_trace
from traces.convert import main as convert_main
from traces.info import main as info_main
from traces.synth import main as synth_main

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def vidur(tmp_path: Path) -> Path:
    return _write(tmp_path / "vidur.csv", "num_prefill_tokens,num_decode_tokens\n10,5\n11,6\n")


@pytest.fixture
def sharegpt(tmp_path: Path) -> Path:
    return _write(tmp_path / "sg.json", '[{"id": "c", "conversations": [{"from": "human", "value": "hello world"}, '
                                        '{"from": "gpt", "value": "fine thanks"}]}]')


# --- traces.convert: options ------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "patterns"), [
    (["--qps", "inf"], ["--qps", "finite"]),
    (["--qps", "1e-320"], ["--qps", "finite"]),  # 1/qps overflows: the arrivals would be infinite
    (["--think-time-s", "inf"], ["--think-time-s", "finite"]),
    (["--think-time-cv", "inf"], ["--think-time-cv", "finite"]),
    (["--seed", "-1"], ["--seed", ">= 0"]),
])
def test_convert_refuses_bad_numeric_options(vidur, tmp_path, capsys, args, patterns):
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", str(tmp_path / "o.parquet"), *args], capsys)
    for pattern in patterns:
        assert re.search(pattern, line), line
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["--tokenizer", "/nowhere"], "--tokenizer only applies to the sharegpt format"),
    (["--think-time-s", "5", "--think-time-cv", "0"], "--think-time-s, --think-time-cv only apply to the sharegpt "
     "format (its text is tokenized and its turns spaced); vidur traces give token counts, not text or conversations"),
])
def test_convert_refuses_sharegpt_options_for_other_formats(vidur, tmp_path, capsys, args, expected):
    # They were accepted and did nothing: a --think-time-s 5 run looked like one with 5 s between turns.
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", str(tmp_path / "o.parquet"), *args], capsys)
    assert expected in line, line
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("cv", ["1e-300", "1e300"])
def test_convert_sharegpt_extreme_think_time_cv_is_no_traceback(sharegpt, tiny_tokenizer_dir, tmp_path, capsys, cv):
    """A CV whose square under- or overflows raised ZeroDivisionError: now fixed gaps, or a one-line error."""
    argv = ["sharegpt", str(sharegpt), "-o", str(tmp_path / "o.parquet"), "--tokenizer", str(tiny_tokenizer_dir),
            "--qps", "1", "--think-time-cv", cv]
    if cv == "1e-300":
        assert convert_main(argv) == 0
    else:
        assert "coefficient of variation" in cli_error(convert_main, argv, capsys)


@pytest.mark.parametrize(("fmt", "args", "expected"), [
    ("vidur", ["--qps", "1e-300"], "the arrivals drawn at --qps 1e-300 reach 6.8e+299 s; expected at most 1e+12 s "
     "(raise --qps)"),
    ("sharegpt", ["--qps", "1", "--think-time-s", "1e308"], "the arrivals drawn at --qps 1 with --think-time-s 1e+308 "
     "reach 3.82e+307 s; expected at most 1e+12 s (raise --qps or lower --think-time-s)"),
])
def test_convert_drawn_arrivals_past_the_bound_name_the_options(tmp_path, capsys, tiny_tokenizer_dir, fmt, args,
                                                                expected):
    """The error named a row of the converted trace and asked 'a timestamp, not an offset?', not the options."""
    source = {"vidur": _write(tmp_path / "v.csv", "num_prefill_tokens,num_decode_tokens\n10,5\n11,6\n"),
              "sharegpt": _write(tmp_path / "sg.json", '[{"id": "c", "conversations": [{"from": "human", '
                                 '"value": "hello"}, {"from": "gpt", "value": "fine"}, {"from": "human", "value": '
                                 '"how are you"}, {"from": "gpt", "value": "fine"}]}]')}[fmt]
    argv = [fmt, str(source), "-o", str(tmp_path / "o.parquet"), *args]
    argv += ["--tokenizer", str(tiny_tokenizer_dir)] if fmt == "sharegpt" else []
    assert cli_error(convert_main, argv, capsys) == f"error: {source}: {expected}"
    assert not (tmp_path / "o.parquet").exists()


def test_convert_limit_beyond_int64_keeps_every_request(vidur, tmp_path):
    out = tmp_path / "o.parquet"
    assert convert_main(["vidur", str(vidur), "-o", str(out), "--limit", str(2**70)]) == 0  # was OverflowError
    assert len(load_trace(out)) == 2


# --- traces.convert: outputs ------------------------------------------------------------------------------

def test_convert_output_under_a_file_or_empty(vidur, tmp_path, capsys):
    a_file = _write(tmp_path / "a_file", "x")
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", str(a_file / "out.parquet")], capsys)
    assert "-o" in line and "is a file, not a folder" in line
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", ""], capsys)  # was "-o : is a directory" (Path(""))
    assert line == "error: argument -o/--output: is empty; name a file (--help lists the options)"


@pytest.mark.parametrize("tool", ["convert", "synth"])
def test_output_path_ending_with_a_slash_is_refused(vidur, tmp_path, capsys, tool):
    """Path('out/') is Path('out'): a file named 'out' was written where a folder was meant."""
    out = f"{tmp_path / 'out'}/"
    main, argv = {"convert": (convert_main, ["vidur", str(vidur), "-o", out]),
                  "synth": (synth_main, ["-o", out, "--num-requests", "3", "--qps", "1"])}[tool]
    assert cli_error(main, argv, capsys) == (f"error: -o {out}: ends with a path separator, naming a folder; expected "
                                             "a parquet file path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vidur.csv"]


def test_convert_never_replaces_a_fifo_or_device(vidur, tmp_path, capsys):
    """-o /dev/null used to rename the parquet over the device node itself."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", str(fifo)], capsys)
    assert str(fifo) in line and "not a regular file" in line
    assert fifo.is_fifo()


# --- traces.convert: source files -------------------------------------------------------------------------

def test_convert_csv_source_that_is_a_directory_or_device(tmp_path, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    assert "it is a directory" in cli_error(convert_main, ["vidur", str(folder), "-o", str(tmp_path / "o")], capsys)
    assert "not a regular file" in cli_error(convert_main, ["azure", "/dev/null", "-o", str(tmp_path / "o")], capsys)


def test_convert_malformed_csv_is_one_line(tmp_path, capsys):
    """polars' parse errors span many lines; the message must stay one line naming the file."""
    source = _write(tmp_path / "q.csv", AZURE_HEADER + '"2023-11-16 18:15:46.6805900,3,5\n')
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert str(source) in line and "line 2: a quoted field is never closed" in line


AZURE_ROWS = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109"]
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@pytest.mark.parametrize(("ending", "bom"), [("\r\n", ""), ("\r\r\n", ""), ("\n", "\ufeff"), ("\r\n", "\ufeff")])
def test_convert_azure_accepts_windows_line_ends_and_a_byte_order_mark(tmp_path, ending, bom):
    """CR CR LF left a carriage return on 'GeneratedTokens', which then was a missing column."""
    source = tmp_path / "az.csv"
    source.write_bytes((bom + ending.join([AZURE_HEADER.strip(), *AZURE_ROWS]) + ending).encode())
    assert convert_main(["azure", str(source), "-o", str(tmp_path / "o.parquet")]) == 0
    assert load_trace(tmp_path / "o.parquet").requests["output_tokens"].to_list() == [44, 109]


@pytest.mark.parametrize("fmt", ["azure", "burstgpt"])
def test_convert_csv_with_bare_carriage_returns_says_so(tmp_path, capsys, fmt):
    """Classic Mac line ends (CR alone) were read as one header line: 'the header names column ... more than once'
    or a missing column, not the line ends."""
    burstgpt_rows = ["5.0,ChatGPT,10,20,30,Conversation log", "6.0,ChatGPT,11,21,32,Conversation log"]
    header, rows = (AZURE_HEADER, AZURE_ROWS) if fmt == "azure" else (BURSTGPT_HEADER, burstgpt_rows)
    source = tmp_path / f"{fmt}.csv"
    source.write_bytes(("\r".join([header.strip(), *rows]) + "\r").encode())
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == (f"error: {source}: its lines end in a bare carriage return (CR); expected LF or CRLF line endings "
                    "(tr '\\r' '\\n' converts it)")
    assert not (tmp_path / "o.parquet").exists()


def test_convert_mooncake_accepts_a_byte_order_mark(tmp_path):
    """Azure's reader skipped a BOM but Mooncake's line parser called it invalid JSON."""
    source = tmp_path / "mc.jsonl"
    source.write_bytes('\ufeff{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'.encode())
    assert convert_main(["mooncake", str(source), "-o", str(tmp_path / "o.parquet")]) == 0


@pytest.mark.parametrize(("fmt", "text", "pattern"), [
    ("azure", AZURE_HEADER + AZURE_ROWS[0] + "\n" + AZURE_ROWS[1] + ",7\n", "line 3: 4 fields; expected 3"),
    ("azure", AZURE_HEADER + AZURE_ROWS[0] + "\n2023-11-16 18:15:47.0,\"10,10\n",
     "line 3: a quoted field is never closed"),
    ("burstgpt", BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n6,ChatGPT,100,20,120\n",
     "line 3: 5 fields; expected 6"),  # was accepted with no log type
])
def test_convert_ragged_csv_names_the_line(tmp_path, capsys, fmt, text, pattern):
    """polars named no line for these, and gave advice on its own reader options (truncate_ragged_lines)."""
    source = _write(tmp_path / "t.csv", text)
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert str(source) in line and pattern in line, line
    assert "truncate_ragged_lines" not in line and "might want" not in line
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("fmt", ["azure", "burstgpt", "vidur"])
@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_convert_skips_blank_lines_in_a_csv(tmp_path, fmt, ending):
    """A blank line (an editor's or a concatenation's, most often at the end) was read as a row of empty fields:
    'line 4: field ... is empty'. Blank lines are no records, as for Python's csv module; request ids count the
    data rows only."""
    header, rows = {
        "azure": (AZURE_HEADER.strip(), AZURE_ROWS),
        "burstgpt": (BURSTGPT_HEADER.strip(), ["5,ChatGPT,374,44,418,Conversation log", "6,GPT-4,396,109,505,API log"]),
        "vidur": ("arrived_at,num_prefill_tokens,num_decode_tokens", ["0.5,374,44", "1.5,396,109"]),
    }[fmt]
    source = tmp_path / "blank.csv"
    source.write_bytes(ending.join([header, "", rows[0], "", "", rows[1], "", ""]).encode())
    assert convert_main([fmt, str(source), "-o", str(tmp_path / "o.parquet")]) == 0
    requests = load_trace(tmp_path / "o.parquet").requests
    assert requests["request_id"].to_list() == [0, 1]
    assert requests["prompt_tokens"].to_list() == [374, 396]
    assert requests["output_tokens"].to_list() == [44, 109]


@pytest.mark.parametrize(("text", "pattern"), [
    # a quoted field over two lines: the bad row starts on line 4, not 3
    (BURSTGPT_HEADER + '5,"Chat\nGPT",100,20,120,Conversation log\n6,ChatGPT,abc,20,120,API log\n',
     "line 4: field 'Request tokens' is 'abc'"),
    # blank lines before the bad row are lines too
    (BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n\n\n6,ChatGPT,-3,20,120,API log\n",
     "line 5: field 'Request tokens' is -3"),
    # blank lines before the header (polars skips them) are lines too, not the header
    ("\n\n" + BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n6,ChatGPT,-3,20,120,API log\n",
     "line 5: field 'Request tokens' is -3"),
    ("\n" + BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n\n6,ChatGPT,-3,20,120,API log\n",
     "line 5: field 'Request tokens' is -3"),
    ("\n" + BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n6,ChatGPT,100,20,120\n",
     "line 4: 5 fields; expected 6"),
    # a row of empty fields is not a blank line: it is refused, naming its line
    (BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n,,,,,\n", "line 3: field 'Timestamp' is empty"),
])
def test_convert_csv_errors_name_the_line_a_record_starts_on(tmp_path, capsys, text, pattern):
    source = _write(tmp_path / "t.csv", text)
    line = cli_error(convert_main, ["burstgpt", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert pattern in line, line


def test_convert_azure_timestamp_error_names_the_line_after_a_multiline_record(tmp_path, capsys):
    source = _write(tmp_path / "t.csv", 'TIMESTAMP,ContextTokens,GeneratedTokens,Note\n'
                                        '2023-11-16 18:15:46.6805900,3,5,"a\nb\nc"\nyesterday,3,5,x\n')
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert "line 5: field 'TIMESTAMP' is 'yesterday'" in line, line


def test_convert_refuses_a_repeated_header_column(tmp_path, capsys):
    source = _write(tmp_path / "dup.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                                          "2023-11-16 18:15:46.6805900,3,5,4\n")
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert "'ContextTokens' more than once" in line


def test_convert_keeps_every_digit_of_a_large_token_count(tmp_path):
    """2**53 + 1 went through a float and came out as 2**53."""
    source = _write(tmp_path / "big.csv", AZURE_HEADER + "2023-11-16 18:15:46.6805900,9007199254740993,5\n"
                                                         "2023-11-16 18:15:47.6805900,12.0,5\n")
    out = tmp_path / "o.parquet"
    assert convert_main(["azure", str(source), "-o", str(out)]) == 0
    assert load_trace(out).requests["prompt_tokens"].to_list() == [9007199254740993, 12]


@pytest.mark.parametrize(("fmt", "header", "row"), [
    ("azure", AZURE_HEADER, "2023-11-16 18:15:46,{},5\n"),
    ("burstgpt", "Timestamp,Request tokens,Response tokens\n", "5,{},4\n"),
    ("vidur", "num_prefill_tokens,num_decode_tokens\n", "{},5\n"),
])
def test_convert_token_counts_at_the_int64_edge(tmp_path, capsys, fmt, header, row):
    """2**63 - 1 (and 9223372036854775000) parse exactly, but the float column beside them rounds to 2**63, which
    the strict int64 cast refused: a polars InvalidOperationError traceback. Exact digits below 2**63 convert, as
    a parquet trace holds them; a count past it, or one that only a float spells, is the line's error."""
    out = tmp_path / "o.parquet"
    for value in (2**63 - 1, 9223372036854775000):
        source = _write(tmp_path / f"{fmt}.csv", header + row.format(value))
        assert convert_main([fmt, str(source), "-o", str(out), "--overwrite"]) == 0
        assert load_trace(out).requests["prompt_tokens"].to_list() == [value]
    column = header.split(",")[1 if fmt != "vidur" else 0]
    for text in (str(2**63), "9223372036854775807.0"):
        source = _write(tmp_path / f"{fmt}.csv", header + row.format(text))
        line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "no.parquet")], capsys)
        assert line == f"error: {source}: line 2: field {column!r} is {text}; expected an integer below 2**63"
    assert not (tmp_path / "no.parquet").exists()


@pytest.mark.parametrize(("stamp", "pattern"), [
    ("9999-12-31 23:59:59.0", "outside the years"),  # wrapped around int64 nanoseconds silently
    ("", "is empty"),
])
def test_convert_azure_bad_timestamps(tmp_path, capsys, stamp, pattern):
    source = _write(tmp_path / "t.csv", AZURE_HEADER + f"2023-11-16 18:15:46.6805900,3,5\n{stamp},3,5\n")
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert "line 3: field 'TIMESTAMP'" in line and pattern in line


def test_convert_azure_span_beyond_int64_nanoseconds_names_the_latest_line(tmp_path, capsys):
    """Arrivals are int64 nanoseconds after the earliest time: 300 years wrapped around to a negative arrival, refused
    as 'row 0 (request_id 1): column 'arrival_s' is negative', a row of the converted trace and the wrong reason."""
    source = _write(tmp_path / "t.csv", AZURE_HEADER + "2023-11-16 18:15:46,3,5\n2200-01-01 00:00:00,3,5\n"
                                                       "1900-01-01 00:00:00,3,5\n")
    assert cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys) == (
        f"error: {source}: line 3: field 'TIMESTAMP' is 2200-01-01 00:00:00, 300 years after the earliest "
        "(1900-01-01 00:00:00); expected a trace spanning at most 292 years")
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(("record", "pattern"), [
    ('"input_length": 10, "output_length": 1180591620717411303424, "hash_ids": [1]', "'output_length'"),
    ('"input_length": 10, "output_length": 5, "hash_ids": [1180591620717411303424]', "'hash_ids'"),
])
def test_convert_mooncake_integers_beyond_int64(tmp_path, capsys, record, pattern):
    source = _write(tmp_path / "m.jsonl", '{"timestamp": 0, ' + record + "}\n")
    line = cli_error(convert_main, ["mooncake", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert f"{source}: line 1: field {pattern}" in line


@pytest.mark.parametrize("fmt", ["mooncake", "sharegpt"])
def test_convert_json_integer_of_5000_digits_names_the_file(tmp_path, capsys, tiny_tokenizer_dir, fmt):
    """json.loads raises a plain ValueError for an integer past Python's 4300-digit limit: the line was its own
    message ('Exceeds the limit ... use sys.set_int_max_str_digits()'), naming no file."""
    huge = "9" * 5000
    if fmt == "mooncake":
        good = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
        source = _write(tmp_path / "m.jsonl", good + good.replace('"input_length": 10', f'"input_length": {huge}'))
        expected = (f"error: {source}: line 2: cannot read the JSON (a number of more than 4300 digits); expected "
                    "one object per line")
    else:
        source = _write(tmp_path / "sg.json", f'[{{"id": {huge}, "conversations": []}}]')
        expected = (f"error: {source}: cannot read the JSON (a number of more than 4300 digits); expected a list of "
                    "conversations")
    tokenizer = ["--tokenizer", str(tiny_tokenizer_dir)] if fmt == "sharegpt" else []
    argv = [fmt, str(source), "-o", str(tmp_path / "o.parquet"), *tokenizer, "--qps", "1"]
    assert cli_error(convert_main, argv, capsys) == expected
    assert not (tmp_path / "o.parquet").exists()


# --- traces.synth -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "pattern"), [
    (["--qps", "inf"], "--qps"),
    (["--qps", "1e-320"], "--qps"),
    (["--num-requests", "100000000000"], "--num-requests"),  # was a MemoryError traceback
    (["--arrival", "gamma", "--cv", "inf"], "--cv (a coefficient of variation)"),  # were ZeroDivisionError tracebacks
    (["--arrival", "gamma", "--cv", "1e308"], "coefficient of variation"),
    (["--multi-turn", "--think-time-cv", "inf"], "--think-time-cv"),
    (["--multi-turn", "--warmup-s", "nan"], "--warmup-s"),  # these four hung
    (["--multi-turn", "--warmup-s", "inf"], "--warmup-s"),
    (["--multi-turn", "--warmup-s", "1e308"], "--warmup-s"),
    (["--multi-turn", "--think-time-s", "1e308"], "--think-time-s"),
    (["--multi-turn", "--think-time-s", "inf"], "--think-time-s"),
    # OverflowError tracebacks; the geometric cap built a 10^12-element array to take its mean
    (["--prompt-dist", "lognormal:mean=1e308,sigma=1e308"], "mean must be a finite number up to 2**40"),
    (["--prompt-dist", "lognormal:mean=100,sigma=50"], "sigma must be a finite number up to 10"),
    (["--multi-turn", "--hash-block-size", str(2**70)], "--hash-block-size must be from 1 to 2147483648"),
    (["--multi-turn", "--turns", "geometric:mean=3,max=1e13"], "max must be a finite number up to 2**40"),
    (["--multi-turn", "--max-context-tokens", str(10**20)], "--max-context-tokens must be from 2 to 2**40, got "
     "100000000000000000000"),
    (["--multi-turn", "--max-context-tokens", "1"], "--max-context-tokens must be from 2 to 2**40, got 1"),
    # The errors named SynthConfig's fields, or a row of the trace, or only numpy's "expected non-negative integer".
    (["--qps", "1e-308"], "--qps 1e-308 spreads 5 requests over inf s; expected at most 1e+12 s (raise --qps)"),
    (["--seed", "-1"], "--seed must be an integer >= 0, got -1"),
])
def test_synth_refuses_bad_numbers(tmp_path, capsys, args, pattern):
    # An option is given once (a second one is refused): the defaults only where the case gives none.
    defaults = [arg for flag, value in (("--num-requests", "5"), ("--qps", "1")) if flag not in args
                for arg in (flag, value)]
    argv = ["-o", str(tmp_path / "s.parquet"), *defaults, *args]
    line = cli_error(synth_main, argv, capsys)
    assert pattern in line and "given twice" not in line
    assert not (tmp_path / "s.parquet").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["--hash-block-size", "7"], "--hash-block-size applies to --multi-turn sessions; pass --multi-turn or leave it "
     "out"),
    # Each option's default, given explicitly: told from one left out only by its value, it was ignored.
    (["--hash-block-size", "16"], "--hash-block-size applies to --multi-turn sessions; pass --multi-turn or leave it "
     "out"),
    (["--turns", "sharegpt", "--think-time-s", "30", "--think-time-cv", "1", "--max-context-tokens", "16384"],
     "--turns, --think-time-s, --think-time-cv, --max-context-tokens apply to --multi-turn sessions; pass "
     "--multi-turn or leave them out"),
    (["--turns", "fixed:3", "--think-time-s", "5", "--think-time-cv", "0", "--max-context-tokens", "100",
      "--warmup-s", "0"], "--turns, --think-time-s, --think-time-cv, --max-context-tokens, --warmup-s apply to "
     "--multi-turn sessions; pass --multi-turn or leave them out"),
])
def test_synth_refuses_session_options_without_multi_turn(tmp_path, capsys, args, expected):
    """Each was ignored without a word: --hash-block-size 7 wrote a single-turn trace without hash_ids."""
    argv = ["-o", str(tmp_path / "s.parquet"), "--num-requests", "5", "--qps", "1", *args]
    assert cli_error(synth_main, argv, capsys) == f"error: {expected} (--help lists the options)"
    assert not (tmp_path / "s.parquet").exists()
    assert synth_main([*argv, "--multi-turn"]) == 0


def test_synth_counts_the_prompts_it_cuts_to_the_context(tmp_path, capsys):
    """--multi-turn cut every 20000-token first turn to 8192 tokens and said nothing."""
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "20", "--qps", "1", "--multi-turn", "--prompt-dist", "fixed:20000"]
    assert synth_main(argv) == 0
    assert capsys.readouterr().out.rstrip().endswith("20 first turns cut to fit --max-context-tokens 16384")
    assert load_trace(out).requests["prompt_tokens"].max() == 8192 and "_cut_to_fit" not in load_trace(out).requests


def test_synth_says_first_turns_not_prompts_were_cut(tmp_path, capsys):
    """Outputs of 20,000 tokens were cut to the context and the line said '20 prompts cut to fit', of 100-token
    prompts left whole."""
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "20", "--qps", "1", "--multi-turn", "--prompt-dist", "fixed:100",
            "--output-dist", "fixed:20000"]
    assert synth_main(argv) == 0
    assert capsys.readouterr().out.rstrip().endswith("20 first turns cut to fit --max-context-tokens 16384")
    requests = load_trace(out).requests
    assert requests["prompt_tokens"].max() == 100 and requests["output_tokens"].max() == 16384 - 100
    assert synth_main(["-o", str(out), "--num-requests", "20", "--qps", "1", "--multi-turn", "--overwrite"]) == 0
    assert "cut" not in capsys.readouterr().out  # the default prompts fit


def test_synth_geometric_turns_with_a_huge_cap(tmp_path):
    """The capped mean summed 10^12 terms (a MemoryError said to be --num-requests')."""
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "20", "--qps", "2", "--multi-turn", "--turns",
            "geometric:mean=3,max=1e12"]
    assert synth_main(argv) == 0 and len(load_trace(out)) == 20


def test_synth_draws_no_turn_a_session_cannot_keep(tmp_path, monkeypatch):
    """--turns fixed:1000000 drew a million turns for each of 256 sessions (10 GB, over a minute) to keep the few
    that fit --max-context-tokens: a turn k needs 2 (k + 1) tokens of it, so at most half of it in turns."""
    import traces.sessions as sessions

    asked = []
    draw = sessions.gamma_gaps_s

    def counting(num, *args):
        asked.append(num)
        assert num <= 256 * 32, f"drew {num} think times"  # fail at once rather than allocate gigabytes
        return draw(num, *args)

    monkeypatch.setattr(sessions, "gamma_gaps_s", counting)
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "10", "--qps", "1", "--multi-turn", "--turns", "fixed:1000000",
            "--max-context-tokens", "64"]
    assert synth_main(argv) == 0
    trace = load_trace(out).requests
    assert len(trace) == 10 and trace["turn"].max() < 32 and max(asked) <= 256 * 32


def test_synth_sessions_too_long_to_draw_are_refused(tmp_path, capsys):
    """With a context that keeps them all, 10**8 turns a session were drawn whole (a MemoryError said to be
    --num-requests')."""
    out = tmp_path / "s.parquet"
    line = cli_error(synth_main, ["-o", str(out), "--num-requests", "10", "--qps", "1", "--multi-turn", "--turns",
                                  "fixed:100000000", "--max-context-tokens", str(2**40)], capsys)
    assert line.endswith("error: --turns fixed:100000000: a session drew 100,000,000 turns; expected at most "
                         "16,777,216 (lower --turns, or --max-context-tokens: a session keeps at most half of it in "
                         "turns) (--help lists the options)"), line
    assert not out.exists()


def test_synth_sessions_drawn_one_at_a_time_are_the_same(monkeypatch):
    """Blocks of one session add each session's think times in one running sum (a step per turn took minutes for
    10**7 turns): the same sums, so the same trace as the default blocks."""
    import traces.sessions as sessions
    from traces.synth import SynthConfig, synthesize_counting_cuts

    config = SynthConfig(num_requests=300, qps=5, multi_turn=True, turns_dist="uniform:low=1,high=60", seed=3)
    expected = synthesize_counting_cuts(config)[0].requests
    monkeypatch.setattr(sessions, "_FIRST_BLOCK", 1)
    monkeypatch.setattr(sessions, "_MAX_BLOCK", 1)
    assert synthesize_counting_cuts(config)[0].requests.equals(expected)


def test_synth_tiny_cv_gives_fixed_gaps(tmp_path):
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "3", "--qps", "2", "--arrival", "gamma", "--cv", "1e-320"]
    assert synth_main(argv) == 0
    assert load_trace(out).requests["arrival_s"].to_list() == [0.0, 0.5, 1.0]


def test_synth_unwritable_output(tmp_path, capsys):
    a_file = _write(tmp_path / "a_file", "x")
    line = cli_error(synth_main, ["-o", str(a_file / "s.parquet"), "--num-requests", "3", "--qps", "1"], capsys)
    assert line.startswith(f"error: -o {a_file / 's.parquet'}") and "not a folder" in line


# --- traces.info (and every loader of a trace) ------------------------------------------------------------

def _frame(**columns) -> pl.DataFrame:
    base = {"request_id": pl.Series([0], dtype=pl.Int64), "arrival_s": [0.0], "prompt_tokens": [3],
            "output_tokens": [1]}
    return pl.DataFrame({**base, **columns})


@pytest.mark.parametrize(("frame", "pattern"), [
    (_frame(prompt_tokens=pl.Series([2**64 - 1], dtype=pl.UInt64)), "column 'prompt_tokens' is 18446744073709551615"),
    (_frame(output_tokens=[1e30]), "column 'output_tokens' is 1e\\+30"),
    (_frame(prompt_token_ids=pl.Series([[1, 2, 2**64 - 1]], dtype=pl.List(pl.UInt64))), "beyond int64"),
])
def test_info_values_beyond_int64(tmp_path, capsys, frame, pattern):
    path = tmp_path / "t.parquet"
    frame.write_parquet(path)
    line = cli_error(info_main, [str(path)], capsys)
    assert str(path) in line and re.search(pattern, line), line


def test_info_huge_hash_block_size_metadata(tmp_path, capsys):
    table = pa.table({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [3], "output_tokens": [1],
                      "hash_ids": [[1]]}).replace_schema_metadata({b"hash_block_size": b"9" * 23})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    assert "schema metadata 'hash_block_size'" in cli_error(info_main, [str(path)], capsys)


@pytest.mark.parametrize("raw", [b"1_6", b"+16", b" 16", b"16\n", b"-0", "\u0661\u0666".encode()])
def test_info_hash_block_size_metadata_of_plain_digits_only(tmp_path, capsys, raw):
    """int() takes underscores, a sign, spaces and other scripts' digits: "1_6" was read as a block size of 16."""
    table = pa.table({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [3], "output_tokens": [1],
                      "hash_ids": [[1]]}).replace_schema_metadata({b"hash_block_size": raw})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    line = cli_error(info_main, [str(path)], capsys)
    assert line.startswith(f"error: {path}: schema metadata 'hash_block_size' is {raw!r}; expected a decimal "
                           "integer"), line


def test_info_a_column_given_twice(tmp_path, capsys):
    """parquet holds two columns of one name, polars refuses them: a DuplicateError traceback."""
    table = pa.table([[0], [0.0], [3], [1], [4]],
                     names=["request_id", "arrival_s", "prompt_tokens", "output_tokens", "prompt_tokens"])
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    line = cli_error(info_main, [str(path)], capsys)
    assert line == f"error: {path}: column 'prompt_tokens' appears more than once; expected each column once"


def test_info_bad_file_exits_2(tmp_path, capsys):
    assert "no such file" in cli_error(info_main, [str(tmp_path / "missing.parquet")], capsys)


def test_info_names_a_fifo_or_device_as_such(tmp_path, capsys):
    """A FIFO or /dev/zero was 'the file is empty (0 bytes)': their size says nothing of what they hold."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        line = cli_error(info_main, [str(path)], capsys)
        assert f"{path}: cannot read the trace: not a regular file (a device, FIFO or socket)" in line, line


def test_trace_head_and_time_scale_at_the_limits():
    from traces.schema import Trace

    trace = Trace.from_frame(_frame(request_id=pl.Series([0, 1]), arrival_s=[0.0, 1.0], prompt_tokens=[3, 4],
                                    output_tokens=[1, 1]), "t")
    assert len(trace.head(2**70)) == 2  # polars raised OverflowError (engine.replay --limit 2**70)
    with pytest.raises(ValueError, match="stretches the last arrival to 1.7e\\+308 s"):
        trace.with_time_scale(1.7e308)
    with pytest.raises(ValueError, match="stretches the last arrival to 1e\\+13 s; expected at most 1e\\+12 s"):
        trace.with_time_scale(1e13)  # finite, but past what a loaded trace may hold
    assert trace.with_time_scale(1e12).requests["arrival_s"].to_list() == [0.0, 1e12]


@pytest.mark.parametrize("fmt", ["mooncake", "sharegpt"])
@pytest.mark.parametrize("kind", ["fifo", "device", "deep"])
def test_convert_json_source_that_is_a_fifo_a_device_or_nested_deep(tmp_path, capsys, tiny_tokenizer_dir, fmt, kind):
    """A FIFO or /dev/zero blocked or filled memory (the CSV formats already refused them); arrays nested 100,000
    deep were a RecursionError traceback."""
    source = tmp_path / "src.json"
    if kind == "fifo":
        os.mkfifo(source)
    elif kind == "device":
        source = Path("/dev/zero")
    else:
        source.write_text("[" * 100_000 + "]" * 100_000)
    tokenizer = ["--tokenizer", str(tiny_tokenizer_dir)] if fmt == "sharegpt" else []
    argv = [fmt, str(source), "-o", str(tmp_path / "o.parquet"), *tokenizer, "--qps", "1"]
    line = cli_error(convert_main, argv, capsys)
    expected = "JSON nested too deeply to read" if kind == "deep" else "cannot read: not a regular file"
    assert line.startswith(f"error: {source}: ") and expected in line, line
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize(("signal_name", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_during_synth_exits_130_in_one_line_and_writes_nothing(tmp_path, signal_name, status):
    """Was a KeyboardInterrupt traceback (status -2) for traces.convert, synth and info, and the sim and analysis
    tools without a folder of their own; SIGTERM (timeout's) killed at once, leaving any partial file behind."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "s.parquet"
    proc = subprocess.Popen([sys.executable, "-m", "traces.synth", "-o", str(out), "--num-requests", "20000000",
                             "--qps", "10"], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)  # drawing 20M requests takes far longer
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(getattr(signal, signal_name))
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == status and stderr == "interrupted: nothing written\n", stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tool", ["convert", "info"])
def test_ctrl_c_in_the_trace_tools_is_one_line(tmp_path, capsys, monkeypatch, vidur, tool):
    import traces.schema

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(traces.schema.Trace, "from_frame", interrupted)
    main, argv = {"convert": (convert_main, ["vidur", str(vidur), "-o", str(tmp_path / "o.parquet")]),
                  "info": (info_main, [str(REPO_ROOT / "traces" / "sharegpt.parquet")])}[tool]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 130 and capsys.readouterr().err == "interrupted: nothing written\n"
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("fmt", ["mooncake", "sharegpt"])
def test_convert_reads_gzipd_json_as_the_csv_formats_do(tmp_path, tiny_tokenizer_dir, fmt):
    """polars reads a gzip'd CSV; the JSON formats failed on one with "'utf-8' codec can't decode byte 0x8b"."""
    import gzip

    text = {"mooncake": '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n'
                        '{"timestamp": 7, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n',
            "sharegpt": '[{"id": "c", "conversations": [{"from": "human", "value": "hello world"}, '
                        '{"from": "gpt", "value": "fine thanks"}]}]'}[fmt]
    extra = ["--tokenizer", str(tiny_tokenizer_dir), "--qps", "1"] if fmt == "sharegpt" else []
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(("\ufeff" + text).encode()))
    assert convert_main([fmt, str(plain), "-o", str(tmp_path / "a.parquet"), *extra]) == 0
    assert convert_main([fmt, str(packed), "-o", str(tmp_path / "b.parquet"), *extra]) == 0
    assert load_trace(tmp_path / "a.parquet").requests.equals(load_trace(tmp_path / "b.parquet").requests)


@pytest.mark.parametrize(("fmt", "text"), [
    ("mooncake", '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n' * 200),
    ("burstgpt", BURSTGPT_HEADER + "5,ChatGPT,100,20,120,Conversation log\n" * 200 + "6,ChatGPT,100\n"),
], ids=["mooncake", "burstgpt"])
def test_convert_corrupt_gzip_is_one_line(tmp_path, capsys, fmt, text):
    """A corrupt deflate stream raises zlib.error, which is no OSError: it escaped as a traceback."""
    import gzip

    data = bytearray(gzip.compress(text.encode()))
    data[20:30] = b"\xff" * 10
    source = tmp_path / "t.gz"
    source.write_bytes(bytes(data))
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert str(source) in line


# --- an existing -o -----------------------------------------------------------------------------------------

def test_convert_and_synth_refuse_to_replace_a_file_without_overwrite(vidur, tmp_path, capsys):
    """Both renamed their parquet over whatever file -o named, another trace included, without a word."""
    out = _write(tmp_path / "earlier.parquet", "an earlier trace")
    line = cli_error(convert_main, ["vidur", str(vidur), "-o", str(out)], capsys)
    assert line == f"error: -o {out}: exists; pass --overwrite to replace it"
    line = cli_error(synth_main, ["-o", str(out), "--num-requests", "3", "--qps", "1"], capsys)
    assert line == f"error: -o {out}: exists; pass --overwrite to replace it"
    assert out.read_text() == "an earlier trace"
    assert convert_main(["vidur", str(vidur), "-o", str(out), "--overwrite"]) == 0
    assert len(load_trace(out)) == 2
    assert synth_main(["-o", str(out), "--num-requests", "3", "--qps", "1", "--overwrite"]) == 0
    assert len(load_trace(out)) == 3


def test_convert_never_writes_into_its_tokenizer(sharegpt, tiny_tokenizer_dir, tmp_path, capsys):
    target = tiny_tokenizer_dir / "tokenizer.json"
    before = target.read_bytes()
    line = cli_error(convert_main, ["sharegpt", str(sharegpt), "-o", str(target), "--tokenizer",
                                    str(tiny_tokenizer_dir), "--qps", "1", "--overwrite"], capsys)
    assert line == f"error: -o {target} is inside --tokenizer {tiny_tokenizer_dir}; write the parquet elsewhere"
    assert target.read_bytes() == before


# --- compressed sources other than gzip ---------------------------------------------------------------------

def _compress(data: bytes, compression: str) -> bytes:
    import bz2
    import lzma

    if compression == "zstd":
        return _zstd_frame(data)
    return {"bz2": bz2.compress, "xz": lzma.compress}[compression](data)


def _zstd_frame(data: bytes) -> bytes:
    """A zstd frame (pyarrow's raw codec output is one; the standard library has no zstd before 3.14)."""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as stream:
        stream.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("compression", ["zstd", "bz2", "xz"])
@pytest.mark.parametrize("fmt", ["mooncake", "sharegpt", "azure"])
def test_convert_reads_zstd_bz2_and_xz_sources(tmp_path, tiny_tokenizer_dir, fmt, compression):
    """The JSON formats failed on a zstd'd file as "can't decode byte 0xb5", and a bz2'd or xz'd CSV as "invalid utf-8
    sequence"; polars reads a zstd'd CSV itself, but the csv module's line checks read nothing of it (blank lines
    became empty rows: 'field TIMESTAMP is empty')."""
    text = {"mooncake": '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n\n'
                        '{"timestamp": 7, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}\n',
            "sharegpt": '[{"id": "c", "conversations": [{"from": "human", "value": "hello world"}, '
                        '{"from": "gpt", "value": "fine thanks"}]}]',
            "azure": AZURE_HEADER + "\n2023-11-16 18:15:46.6805900,10,20\n\n2023-11-16 18:15:47.0,4,6\n\n"}[fmt]
    extra = ["--tokenizer", str(tiny_tokenizer_dir), "--qps", "1"] if fmt == "sharegpt" else []
    plain, packed = tmp_path / "t.txt", tmp_path / "t.packed"
    plain.write_text(text)
    packed.write_bytes(_compress(("\ufeff" + text).encode(), compression))
    assert convert_main([fmt, str(plain), "-o", str(tmp_path / "a.parquet"), *extra]) == 0
    assert convert_main([fmt, str(packed), "-o", str(tmp_path / "b.parquet"), *extra]) == 0
    assert load_trace(tmp_path / "a.parquet").requests.equals(load_trace(tmp_path / "b.parquet").requests)


@pytest.mark.parametrize("compression", ["zstd", "bz2", "xz"])
def test_convert_compressed_csv_errors_name_the_line(tmp_path, capsys, compression):
    source = tmp_path / "t.csv.packed"
    text = AZURE_HEADER + "\n2023-11-16 18:15:46.6805900,10,20\n\n2023-11-16 18:15:47.0,abc,6\n"
    source.write_bytes(_compress(text.encode(), compression))
    line = cli_error(convert_main, ["azure", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == f"error: {source}: line 5: field 'ContextTokens' is 'abc'; expected an integer"


@pytest.mark.parametrize("compression", ["zstd", "bz2", "xz"])
@pytest.mark.parametrize("fmt", ["mooncake", "vidur"])
def test_convert_truncated_compressed_source_is_one_line(tmp_path, capsys, fmt, compression):
    text = ("".join(f'{{"timestamp": {i}, "input_length": {i + 1}, "output_length": 5, "hash_ids": [0]}}\n'
                    for i in range(500)) if fmt == "mooncake"
            else "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{i + 1},5\n" for i in range(2000)))
    packed = _compress(text.encode(), compression)
    source = tmp_path / "t.packed"
    source.write_bytes(packed[: len(packed) // 2])
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line.startswith(f"error: {source}: ")


def test_convert_binary_json_source_says_it_is_no_utf8(tmp_path, capsys):
    source = tmp_path / "t.jsonl"
    source.write_bytes(b"\x80\x81{}\n")
    line = cli_error(convert_main, ["mooncake", str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == (f"error: {source}: line 1: cannot read: not UTF-8 text (byte 80 at offset 0); expected UTF-8 "
                    "text, plain or compressed with gzip, zstd, bz2 or xz (iconv -f WINDOWS-1252 -t UTF-8 converts "
                    "Windows text)")


@pytest.mark.parametrize(("fmt", "expected"), [("azure", "a CSV file"), ("mooncake", "a Mooncake JSONL file")])
def test_convert_utf16_source_says_so(tmp_path, capsys, fmt, expected):
    """Excel's 'Unicode text' is UTF-16: polars read its header as names full of NUL bytes that matched nothing."""
    source = tmp_path / "t.txt"
    source.write_text(AZURE_HEADER + "2023-11-16 18:15:46,1,2\n", encoding="utf-16")
    line = cli_error(convert_main, [fmt, str(source), "-o", str(tmp_path / "o.parquet")], capsys)
    assert line == (f"error: {source}: cannot read: UTF-16 text (its byte order mark says so); expected {expected} in "
                    "UTF-8 (iconv -f UTF-16 -t UTF-8 converts it)")
