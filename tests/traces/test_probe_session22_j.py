"""Probe J (session 22): the converters on inputs a hostile evaluator builds from the public layouts.

Each test failed before its fix in traces/ and names what it guards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces.helpers import cli_error
from traces import load_trace
from traces.convert import main as convert_main

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
STRAY_QUOTE = ("holds a quote (\") inside a value that does not start with one; expected a value without quotes, or "
               "one enclosed in quotes with each inner quote doubled (\"\")")


@pytest.mark.parametrize(("fmt", "text", "where"), [
    # BurstGPT_1 layout with a hand-edited model name: polars said "CSV malformed: expected 0 rows, actual 1 rows, in
    # chunk starting at row_offset 0, length 48", naming neither the line nor what was wrong.
    ("burstgpt", BURSTGPT_HEADER + "5,ChatGPT,472,18,490,Conversation log\n45,Chat\"GPT,1087,230,1317,API log\n",
     "line 3: field 2"),
    # Two such rows: polars read the first quote to the second as one span and counted rows wrongly.
    ("burstgpt", BURSTGPT_HEADER + "1.0,ChatGPT,10,20,30,Conversation \"log\n2.0,ChatGPT,11,21,32,Conversation\" log\n"
     "3.0,ChatGPT,12,22,34,API log\n", "line 2: field 6"),
    # A quoted field holding a line break and doubled quotes is fine; the record after it starts on line 4.
    ("burstgpt", BURSTGPT_HEADER + "1.0,\"Chat\n\"\"GPT\"\"\",10,20,30,\"Conversation log\"\n"
     "2.0,ChatGPT,11,21,32,Conversation\" log\n", "line 4: field 6"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,37\"4,44\n"
     "2023-11-16 18:15:50.9951690,396,109\n", "line 2: field 2"),
], ids=["burstgpt-model", "burstgpt-two-quotes-span-rows", "burstgpt-after-a-multiline-quoted-field", "azure-count"])
def test_a_quote_inside_an_unquoted_field_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         fmt: str, text: str, where: str) -> None:
    source = tmp_path / "trace.csv"
    source.write_text(text)
    out = tmp_path / "out.parquet"
    line = cli_error(convert_main, [fmt, str(source), "-o", str(out)], capsys)
    assert line == f"error: {source}: {where} {STRAY_QUOTE}"
    assert not out.exists()
    assert source.read_text() == text  # the input is never touched


BARE_CR = ("a bare carriage return (CR) ends a record in the middle of the line; expected LF or CRLF line endings "
           "throughout (tr '\\r' '\\n' makes every CR a line end; the blank lines that leaves are skipped)")


@pytest.mark.parametrize(("fmt", "text"), [
    # Azure 2023 layout (CRLF) with one record ended by a CR alone, as when rows from a classic-Mac export are pasted
    # in: polars said "not a readable CSV file (found more fields than defined in 'Schema')", with no line.
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r"
              "2023-11-16 18:15:50.9951690,396,109\r\n2023-11-16 18:15:51.2224670,879,55\r\n"),
    ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\r4.314579,396,109\n4.541877,879,55\n"),
], ids=["azure-crlf", "vidur-lf"])
def test_a_bare_carriage_return_inside_a_file_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             fmt: str, text: str) -> None:
    source = tmp_path / "trace.csv"
    source.write_bytes(text.encode())
    out = tmp_path / "out.parquet"
    line = cli_error(convert_main, [fmt, str(source), "-o", str(out)], capsys)
    assert line == f"error: {source}: line 2: {BARE_CR}"
    assert not out.exists()
    # The advice works: with every CR a line end the same file converts, all three requests, in order.
    fixed = tmp_path / "fixed.csv"
    fixed.write_bytes(text.replace("\r", "\n").encode())
    assert convert_main([fmt, str(fixed), "-o", str(out)]) == 0
    assert load_trace(out).requests["request_id"].to_list() == [0, 1, 2]


def test_cr_cr_lf_line_ends_still_convert(tmp_path: Path) -> None:
    """CRLF written again on Windows (CR CR LF) is a line end the reader accepts; the new check must not call it a
    bare CR."""
    source = tmp_path / "trace.csv"
    source.write_bytes(b"arrived_at,num_prefill_tokens,num_decode_tokens\r\r\n0.0,374,44\r\r\n4.5,396,109\r\r\n")
    out = tmp_path / "out.parquet"
    assert convert_main(["vidur", str(source), "-o", str(out)]) == 0
    assert load_trace(out).requests.select("arrival_s", "prompt_tokens").rows() == [(0.0, 374), (4.5, 396)]
