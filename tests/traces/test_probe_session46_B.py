"""Session 46 (helper B) hostile-input probes of the trace readers and analysis.capacity's prices.

- A trace whose ``prompt_token_ids`` (or ``hash_ids``) column is a fixed-size list (polars' ``Array``: what it makes
  of a 2-D numpy array of token ids, a benchmark's prompts of one length) was refused as "has type Array(Int64,
  shape=(4,)); expected a list of integers", though it holds the very lists the schema asks for.
- A file that is not parquet was told its conversion by its name's suffix alone: the Azure CSV got
  "{azure|burstgpt|vidur}", a compressed one (.csv.gz) nothing, and a run's summary.json (any .json) "traces.convert
  sharegpt", a command that cannot convert it. The hint now reads the file's first line, as the converters' own
  errors do.
- ``analysis.capacity --gpu-cost h100=3`` on a sweep of h200 (the default --gpu) priced the sweep at h200's
  illustrative list price, at exit 0: the option did nothing and the $/1M tokens read as the price given.
- ``analysis.capacity --think-times scale`` on a trace without multi-turn sessions (no session_id, or every id its
  own) swept as with ``keep``, at exit 0, its report saying "think times: scale": there are no think times to scale.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from cli.sim_replay import main as sim_replay
from traces.schema import load_trace

from .helpers import cli_error

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"


def _token_frame(ids: object) -> pl.DataFrame:
    return pl.DataFrame({"request_id": [1, 2], "arrival_s": [0.0, 1.0], "prompt_tokens": [4, 4],
                         "output_tokens": [3, 2], "prompt_token_ids": ids})


def test_prompt_token_ids_of_one_length_in_a_fixed_size_list_are_read_as_lists(tmp_path: Path) -> None:
    path = tmp_path / "fixed.parquet"
    frame = _token_frame(np.array([[1, 2, 3, 4], [1, 2, 3, 5]]))
    assert frame.schema["prompt_token_ids"] == pl.Array(pl.Int64, 4)  # what polars makes of a 2-D array
    frame.write_parquet(path)
    trace = load_trace(path)
    assert trace.requests.schema["prompt_token_ids"] == pl.List(pl.Int64)
    assert trace.prompt_token_ids(0, vocab_size=10) == [1, 2, 3, 4]
    assert trace.prompt_token_ids(1, vocab_size=10) == [1, 2, 3, 5]


def test_a_replay_of_fixed_size_lists_shares_their_prefix(tmp_path: Path, capsys) -> None:
    # Two prompts of 512 tokens sharing their first 256 (one KV block of the default block size).
    ids = np.zeros((2, 512), dtype=np.int64)
    ids[1, 256:] = 1
    path = tmp_path / "fixed.parquet"
    _token_frame(ids).with_columns(pl.Series("prompt_tokens", [512, 512])).write_parquet(path)
    out = tmp_path / "run"
    assert sim_replay([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert pl.read_parquet(out / "requests.parquet")["cached_tokens"].to_list() == [0, 256]


def test_hash_ids_in_a_fixed_size_list_are_read_as_lists(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"request_id": [1, 2], "arrival_s": [0.0, 1.0], "prompt_tokens": [20, 32],
                      "output_tokens": [3, 2], "hash_ids": pa.array([[7, 8], [7, 9]], pa.list_(pa.int64(), 2))})
    path = tmp_path / "fixed_hash.parquet"
    pq.write_table(table.replace_schema_metadata({b"hash_block_size": b"16"}), path)
    trace = load_trace(path)
    assert trace.requests["hash_ids"].to_list() == [[7, 8], [7, 9]]
    assert trace.hash_block_size == 16


@pytest.mark.parametrize(("ids", "problem"), [
    (pl.Series([[1, 2, None, 4], [1, 2, 3, 5]], dtype=pl.Array(pl.Int64, 4)),
     "row 0 (request_id 1): column 'prompt_token_ids' contains a null element; expected a list of integers "
     "(token ids >= 0)"),
    (np.array([[1.0, 2, 3, 4], [1, 2, 3, 5]]),
     "column 'prompt_token_ids' has type Array(Float64, shape=(4,)); expected a list of integers (token ids >= 0)"),
    (np.array([[1, 2, 3], [1, 2, 3]]),
     "row 0 (request_id 1): column 'prompt_token_ids' has 3 ids but prompt_tokens is 4; they must be equal"),
], ids=["null element", "floats", "other length"])
def test_a_fixed_size_list_is_checked_as_a_list_is(tmp_path: Path, capsys, ids, problem: str) -> None:
    path = tmp_path / "bad.parquet"
    _token_frame(ids).write_parquet(path)
    line = cli_error(sim_replay, [str(path), "--out", str(tmp_path / "run")], capsys)
    assert line == f"error: {path}: {problem}"
    assert not (tmp_path / "run").exists()


def _not_parquet(path: Path) -> str:
    return (f"error: {path}: not a readable parquet file (Parquet magic bytes not found in footer. Either the file is "
            "corrupted or this is not a parquet file.); expected ")


def test_an_azure_csv_given_as_a_trace_is_told_to_convert_as_azure(tmp_path: Path, capsys) -> None:
    source = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    source.write_text(AZURE_HEAD)
    line = cli_error(sim_replay, [str(source), "--out", str(tmp_path / "run")], capsys)
    assert line == _not_parquet(source) + (f"a trace parquet: convert this file first (python -m traces.convert "
                                           f"azure {source} -o TRACE.parquet)")


def test_a_compressed_azure_csv_is_told_to_convert_as_azure(tmp_path: Path, capsys) -> None:
    source = tmp_path / "conv.csv.gz"
    source.write_bytes(gzip.compress(AZURE_HEAD.encode()))
    line = cli_error(sim_replay, [str(source), "--out", str(tmp_path / "run")], capsys)
    assert line.endswith(f"convert this file first (python -m traces.convert azure {source} -o TRACE.parquet)")


def test_a_runs_summary_json_is_not_told_to_convert_as_sharegpt(tmp_path: Path, capsys) -> None:
    source = tmp_path / "summary.json"
    source.write_text(json.dumps({"num_requests": 3, "ttft_ms": {"p50": 2.0}}))
    line = cli_error(sim_replay, [str(source), "--out", str(tmp_path / "run")], capsys)
    assert line == _not_parquet(source) + "a trace written by save_trace"


def test_a_csv_of_no_known_header_still_names_the_csv_formats(tmp_path: Path, capsys) -> None:
    source = tmp_path / "times.csv"
    source.write_text("start_s,slowdown\n0,1\n")
    line = cli_error(sim_replay, [str(source), "--out", str(tmp_path / "run")], capsys)
    assert line.endswith(f"(python -m traces.convert {{azure|burstgpt|vidur}} {source} -o TRACE.parquet)")


def _two_requests(tmp_path: Path) -> Path:
    path = tmp_path / "two.parquet"
    pl.DataFrame({"request_id": [1, 2], "arrival_s": [0.0, 1.0], "prompt_tokens": [100, 120],
                  "output_tokens": [20, 30]}).write_parquet(path)
    return path


@pytest.mark.parametrize(("argv", "problem"), [
    (["--gpu-cost", "h100=3"], "--gpu-cost prices h100, and the sweep runs on h200 (--gpu): none of its GPUs would "
     "get the price given; price h200"),
    (["--gpu", "h100,h200", "--gpu-cost", "l40s=1,a100-80g=2"],
     "--gpu-cost prices a100-80g, l40s, and the sweep runs on h100, h200 (--gpu): none of its GPUs would get the "
     "price given; price h100 and h200"),
], ids=["inline", "two gpus"])
def test_capacity_refuses_prices_for_none_of_its_gpus_before_simulating(tmp_path: Path, capsys, argv,
                                                                       problem: str) -> None:
    out = tmp_path / "out"
    line = cli_error(capacity_main, [str(_two_requests(tmp_path)), "--slo", "ttft_p90=2s", *argv, "--out", str(out),
                                     "--quiet"], capsys)
    assert line == f"error: {problem}"
    assert not out.exists()


def test_capacity_refuses_a_price_file_for_none_of_its_gpus(tmp_path: Path, capsys) -> None:
    prices = tmp_path / "prices.txt"
    prices.write_text("h100=3  # the other cluster\n")
    line = cli_error(capacity_main, [str(_two_requests(tmp_path)), "--slo", "ttft_p90=2s", "--gpu-cost", str(prices),
                                     "--out", str(tmp_path / "out"), "--quiet"], capsys)
    assert line == ("error: --gpu-cost prices h100, and the sweep runs on h200 (--gpu): none of its GPUs would get "
                    "the price given; price h200")


def test_capacity_prices_the_gpus_priced_and_keeps_the_list_price_of_the_others(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [str(_two_requests(tmp_path)), "--slo", "ttft_p90=2s", "--gpu", "h200,h100", "--gpu-cost", "h200=7,l40s=1",
            "--max-iterations", "1", "--no-duration-check", "--min-duration-s", "10", "--min-requests", "20",
            "--out", str(out), "--quiet"]
    assert capacity_main(argv) == 0
    prices = {row["options"]["gpu"]: row["cost"]["usd_per_gpu_hour"]
              for row in json.loads((out / "capacity.json").read_text())}
    assert prices == {"h200": 7.0, "h100": 2.5}  # h100 at its illustrative list price, as --help says


QUICK_SWEEP = ["--max-iterations", "1", "--no-duration-check", "--min-duration-s", "10", "--min-requests", "20",
               "--quiet"]


@pytest.mark.parametrize("sessions", [None, [1, None], [1, 2]], ids=["no column", "one and a null", "two ids"])
def test_capacity_refuses_to_scale_think_times_a_trace_has_not(tmp_path: Path, capsys, sessions) -> None:
    frame = pl.read_parquet(_two_requests(tmp_path))
    if sessions is not None:
        frame = frame.with_columns(pl.Series("session_id", sessions, dtype=pl.Int64))
    trace = tmp_path / "sessions.parquet"
    frame.write_parquet(trace)
    out = tmp_path / "out"
    line = cli_error(capacity_main, [str(trace), "--slo", "ttft_p90=2s", "--think-times", "scale", "--out", str(out),
                                     *QUICK_SWEEP], capsys)
    assert line == (f"error: --think-times scale: {trace} has no session of more than one request (a session_id "
                    "column groups a conversation's turns), so there are no think times to scale; leave it out")
    assert not out.exists()


def test_capacity_scales_the_think_times_of_a_trace_with_sessions(tmp_path: Path) -> None:
    trace = tmp_path / "sessions.parquet"
    pl.DataFrame({"request_id": [1, 2, 3], "arrival_s": [0.0, 1.0, 4.0], "prompt_tokens": [100, 120, 300],
                  "output_tokens": [20, 30, 10], "session_id": [1, 2, 1]}).write_parquet(trace)
    assert capacity_main([str(trace), "--slo", "ttft_p90=2s", "--think-times", "scale", "--out",
                          str(tmp_path / "out"), *QUICK_SWEEP]) == 0
