"""Hostile-input probe fixes in the trace tools: traces.bench's cut outputs and impossible prompt counts, the rate of
multi-turn synthetic traces, traces.convert's --seed, and file names holding control characters."""

from __future__ import annotations

import json

import polars as pl
import pytest

from cli.sim_replay import main as sim_main
from cli.traces_bench import main as bench_main
from tests.traces.fake_openai import FakeOpenAI
from tests.traces.helpers import cli_error
from tests.traces.test_bench import _bench, _trace
from traces.convert import main as convert_main
from traces.info import main as info_main
from traces.synth import SynthConfig, synthesize

CUT_MESSAGE = ("1 of 2 requests were cut before the output length the trace asks for (e.g. request 'r0': 2 of 3 "
               "tokens, finish reason 'length', recorded as cut by {}): a limit of the server's (its context length) "
               "ended them, so the workload was not the trace's")


@pytest.mark.parametrize(("cut_by", "recorded"), [
    (None, "max_model_len"),  # vLLM, SGLang: "length" and no word of which limit
    ("kv_capacity", "kv_capacity"),  # ours names it
    ("warp_drive", "max_model_len"),  # not a limit the records know
])
def test_an_output_the_server_cut_is_recorded_as_cut(tmp_path, capsys, cut_by, recorded) -> None:
    """finish_reason "length" with fewer tokens than max_tokens was recorded as a complete output: num_cut 0 and no
    warning, although the workload was not the trace's."""
    trace_path = _trace(tmp_path, [0.0, 0.0], [3, 2])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, cut_after=2, cut_by=cut_by) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "50") == 0
    message = CUT_MESSAGE.format(recorded)
    assert f"warning [outputs_cut_by_the_server]: {message}" in capsys.readouterr().err
    rows = pl.read_parquet(out / "requests.parquet").select("finish_reason", "output_tokens", "error").rows()
    assert rows == [(recorded, 2, None), ("length", 2, None)]  # r1 asked for 2 and got them: not cut
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warnings"] == [{"code": "outputs_cut_by_the_server", "value": 1, "message": message}]
    assert (summary["num_cut"], summary["num_finished"]) == (1, 2)


def test_the_printed_summary_counts_a_cut_output(tmp_path, capsys) -> None:

    trace_path = _trace(tmp_path, [0.0, 0.0], [3, 2])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, cut_after=2) as server:
        assert bench_main([server.url, str(trace_path), "--out", str(tmp_path / "out"), "--no-report",
                           "--vocab-size", "50"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if "cut by a limit" in line] == [["cut", "by", "a", "limit", "1",
                                                                             "(max_model_len", "1)"]]


def test_a_cut_by_on_a_complete_output_cuts_nothing(tmp_path) -> None:
    trace_path = _trace(tmp_path, [0.0], [3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, cut_after=3, cut_by="kv_capacity") as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 0
    assert pl.read_parquet(tmp_path / "out" / "requests.parquet")["finish_reason"].to_list() == ["length"]


def test_a_prompt_count_that_cannot_be_the_ids_sent_fails_its_request(tmp_path, capsys) -> None:
    """With token-id prompts the client knows the prompt's length: a server's other count was recorded in place of
    the trace's, silently (as wrong completion and cached counts are not)."""
    trace_path = _trace(tmp_path, [0.0], [3])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, usage_override={"prompt_tokens": 7}) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "50") == 1
    expected = "the server's usage reports 7 prompt tokens for the 5 token ids sent; expected that many"
    assert f"request 'r0': {expected}" in capsys.readouterr().err
    row = pl.read_parquet(out / "requests.parquet").row(0, named=True)
    assert (row["finish_reason"], row["error"], row["prompt_tokens"]) == ("error", expected, 5)


def test_a_prompt_count_that_matches_the_ids_sent_is_kept(tmp_path) -> None:
    trace_path = _trace(tmp_path, [0.0], [3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 0
    row = pl.read_parquet(tmp_path / "out" / "requests.parquet").row(0, named=True)
    assert (row["finish_reason"], row["prompt_tokens"], row["error"]) == ("length", 5, None)


@pytest.mark.parametrize(("options", "qps"), [
    ({"prompt_dist": "sharegpt", "output_dist": "sharegpt", "max_context_tokens": 500}, 6.0),  # was 1.84 req/s
    ({"prompt_dist": "sharegpt", "output_dist": "sharegpt", "max_context_tokens": 2000}, 6.0),  # was 4.1 req/s
    # was 0.39 req/s; evenly started sessions, as ~110 sessions started at random make the rate of a trace this
    # long vary by ~10 %
    ({"turns_dist": "fixed:1000", "max_context_tokens": 100_000, "think_time_s": 5.0, "arrival_cv": 0.0}, 2.0),
])
def test_multi_turn_rate_is_qps_when_sessions_end_early(options, qps) -> None:
    """--max-context-tokens ends sessions before the turns they drew, and sessions started at qps / mean turns made
    a slower trace than --qps, the long-run request rate."""

    requests = synthesize(SynthConfig(num_requests=20_000, qps=qps, multi_turn=True, seed=1, **options)).requests
    assert (len(requests) - 1) / requests["arrival_s"][-1] == pytest.approx(qps, rel=0.03)


SEED_LINE = ("error: --seed only applies to arrivals drawn at --qps (sharegpt, and vidur without arrived_at); {}, so "
             "it would change nothing (--help lists the options)")


@pytest.mark.parametrize(("fmt", "text", "args", "what"), [
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n", [],
     "azure traces record their arrival times"),
    ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,5\n"
              "2023-11-16 18:15:47.6805900,10,5\n", ["--qps", "2"], "azure traces record their arrival times"),
    ("vidur", "num_prefill_tokens,num_decode_tokens\n10,5\n11,6\n", [],
     "vidur without --qps keeps its recorded arrivals"),
])
def test_convert_refuses_a_seed_that_changes_nothing(tmp_path, capsys, fmt, text, args, what) -> None:
    """--seed 1 and --seed 999 wrote the same bytes: a seed accepted and ignored."""

    source = tmp_path / f"src.{fmt}"
    source.write_text(text)
    out = tmp_path / "o.parquet"
    argv = [fmt, str(source), "-o", str(out), "--seed", "1", *args]
    assert cli_error(convert_main, argv, capsys) == SEED_LINE.format(what)
    assert not out.exists()
    assert convert_main(argv[:-2 - len(args)] + args) == 0  # without --seed it converts


def test_convert_takes_a_seed_where_arrivals_are_drawn(tmp_path) -> None:

    source = tmp_path / "vidur.csv"
    source.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n11,6\n12,7\n")
    for seed in (1, 999):
        assert convert_main(["vidur", str(source), "-o", str(tmp_path / f"{seed}.parquet"), "--qps", "2", "--seed",
                             str(seed)]) == 0
    assert (tmp_path / "1.parquet").read_bytes() != (tmp_path / "999.parquet").read_bytes()


def test_a_file_name_with_a_newline_is_named_on_one_line(tmp_path, capsys) -> None:
    """The error quoting it was printed over two lines by traces.info, traces.convert and sim.replay."""

    bad = tmp_path / "a\nb.parquet"
    bad.write_bytes(b"x")
    shown = str(bad).replace("\n", "\\n")
    unreadable = (f"error: {shown}: not a readable parquet file (Parquet file size is 1 bytes, smaller than the "
                  "minimum file footer (8 bytes)); expected a trace written by save_trace")
    assert cli_error(info_main, [str(bad)], capsys) == unreadable
    assert cli_error(sim_main, [str(bad), "--quiet", "--out", str(tmp_path / "out")], capsys) == unreadable
    missing = tmp_path / "c\td.csv"
    shown = str(missing).replace("\t", "\\t")
    assert (cli_error(convert_main, ["azure", str(missing), "-o", str(tmp_path / "o.parquet")], capsys)
            == f"error: {shown}: cannot read: no such file; expected a CSV file")
