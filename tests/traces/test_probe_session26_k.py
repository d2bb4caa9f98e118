"""Probe K (session 26): silent wrong numbers in traces.convert, on files laid out as the public datasets are.

What the probe found: every converter counted arrivals from the earliest row of the file, dropped rows included.
A failed request first in the file (a BurstGPT row with 0 response tokens, a Mooncake record with input_length 0,
an Azure row with 0 GeneratedTokens, a Vidur row with 0 decode tokens) is dropped, yet its time stayed the trace's
time 0: the converted trace started at that request's gap (the README promises "arrivals start at 0"), the
simulator and the GPU replay sat idle that long before the first request, and ``--qps`` rescaled every gap but that
one (it keeps the first arrival where it is).

Expected: arrival 0 is the earliest request kept; the gaps between kept requests are exactly the source's (Azure to
the nanosecond, Mooncake to the millisecond), and --qps then rescales every gap, the first request at 0.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traces.convert import main as convert_main

BURSTGPT = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "1.0,GPT-4,417,0,417,API log\n"  # a failure: 0 response tokens
            "3.0,ChatGPT,472,18,490,Conversation log\n"
            "5.5,ChatGPT,10,20,30,API log\n")
MOONCAKE = ('{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}\n'
            '{"timestamp": 1000, "input_length": 600, "output_length": 6, "hash_ids": [1, 2]}\n'
            '{"timestamp": 3000, "input_length": 10, "output_length": 6, "hash_ids": [1]}\n'
            '{"timestamp": 4000, "input_length": 10, "output_length": 6, "hash_ids": [3]}\n')
AZURE = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:15:46.0000000,374,0\n"
         "2023-11-16 18:15:46.6805900,396,109\n"
         "2023-11-16 18:15:47.0000001,879,55\n")
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,374,0\n2.0,396,109\n2.25,879,55\n"


def _convert(tmp_path: Path, fmt: str, text: str, *extra: str) -> pl.DataFrame:
    source, out = tmp_path / "source.txt", tmp_path / "out.parquet"
    source.write_text(text)
    assert convert_main([fmt, str(source), "-o", str(out), *extra]) == 0
    return pl.read_parquet(out)


@pytest.mark.parametrize(("fmt", "text", "ids", "arrivals_s"), [
    ("burstgpt", BURSTGPT, [1, 2], [0.0, 2.5]),  # were [2.0, 4.5]
    ("mooncake", MOONCAKE, [1, 2, 3], [0.0, 2.0, 3.0]),  # were [1.0, 3.0, 4.0]
    ("azure", AZURE, [1, 2], [0.0, 319_410_100 / 1e9]),  # were [0.68059, 1.0000001]
    ("vidur", VIDUR, [1, 2], [0.0, 0.25]),  # were [1.5, 1.75]
], ids=["burstgpt", "mooncake", "azure", "vidur"])
def test_arrivals_start_at_the_first_request_kept(tmp_path, capsys, fmt, text, ids, arrivals_s):
    frame = _convert(tmp_path, fmt, text)
    assert frame["request_id"].to_list() == ids
    assert frame["arrival_s"].to_list() == arrivals_s
    assert "dropped 1 request" in capsys.readouterr().out


def test_qps_rescales_every_gap_after_a_dropped_first_request(tmp_path, capsys):
    """--qps 1 on the Mooncake file: 3 requests over 3 s become 3 over 2 s, the first at 0 (was [1.0, 2.33, 3.0]: the
    1 s before the first kept request stayed unscaled)."""
    frame = _convert(tmp_path, "mooncake", MOONCAKE, "--qps", "1")
    assert frame["arrival_s"].to_list() == [0.0, 2.0 * (2 / 3), 3.0 * (2 / 3)]
    assert frame["hash_ids"].to_list() == [[1, 2], [1], [3]]
    assert "span 2.000 s (1.000 req/s)" in capsys.readouterr().out
