"""Hostile-input probe (session 21, A): the trace tools' summary lines for a count of one and a span below a
millisecond; traces.bench records a request the server can never serve as rejected, as the replays do."""

from __future__ import annotations

import json

import polars as pl

from cli.traces_bench import main as bench_main
from tests.traces.fake_openai import FakeOpenAI
from traces.convert import main as convert_main
from traces.info import main as info_main
from traces.schema import save_trace
from traces.synth import main as synth_main


def test_synth_and_info_say_one_request_and_one_session(tmp_path, capsys) -> None:
    """'wrote 1 requests', '1 sessions', '1 first turns cut' and traces.info's '1 requests'."""
    out = tmp_path / "s.parquet"
    assert synth_main(["-o", str(out), "--num-requests", "1", "--qps", "1", "--multi-turn",
                       "--max-context-tokens", "2"]) == 0
    assert capsys.readouterr().out == (
        f"wrote 1 request to {out}: span 0.000 s (all at once), mean prompt 1.0 tokens, mean output 1.0 tokens, "
        "1 session, 1 first turn cut to fit --max-context-tokens 2\n")
    assert info_main([str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: 1 request over 0.000 s, mean prompt 1.0, ")


def test_info_shows_a_span_below_a_millisecond(tmp_path, capsys) -> None:
    """Two requests 33 microseconds apart: traces.info printed 'over 0.000 s' (the span of a trace whose requests all
    arrive at once) where traces.synth, writing it, said 3.29e-05 s."""
    out = tmp_path / "s.parquet"
    assert synth_main(["-o", str(out), "--num-requests", "2", "--qps", "1e5"]) == 0
    assert "span 3.29e-05 s" in capsys.readouterr().out
    assert info_main([str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: 2 requests over 3.29e-05 s, ")


def test_convert_says_one_request_dropped(tmp_path, capsys) -> None:
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:48,0,44\n2023-11-16 18:15:49,3,44\n")
    out = tmp_path / "a.parquet"
    assert convert_main(["azure", str(src), "-o", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"wrote 1 request to {out}: span 0.000 s (all at once), mean prompt 3.0 tokens, mean output 44.0 tokens, "
        "dropped 1 request with 0 prompt or 0 output tokens\n")


def test_bench_records_a_prompt_the_server_can_never_serve_as_rejected(tmp_path, capsys) -> None:
    """A 400 answer for a prompt beyond the server's context (vLLM's "maximum context length", ours "cannot be
    served") was counted as a failed request (num_failed 1, finish reason "error", "1 of 2 requests failed" on
    stderr), where engine.replay and sim.replay of the same trace count it as rejected."""
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["r0", "r1"], "arrival_s": [0.0, 0.05], "prompt_tokens": [5, 8],
                             "output_tokens": [2, 3]}), trace)
    out = tmp_path / "out"
    with FakeOpenAI(failures={3: "context"}) as server:
        assert bench_main([server.url, str(trace), "--out", str(out), "--quiet", "--no-report", "--vocab-size",
                           "50"]) == 0
    assert "failed" not in capsys.readouterr().err
    requests = pl.read_parquet(out / "requests.parquet")
    reason = "This model's maximum context length is 40960 tokens. However, you requested 50000 tokens."
    assert requests.select("finish_reason", "reject_reason", "error", "output_tokens").rows() == [
        ("length", None, None, 2), ("rejected", reason, None, 0)]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_finished"], summary["num_rejected"], summary["num_failed"]) == (1, 1, 0)
    assert summary["reject_reasons"] == {reason: 1}


def test_convert_refuses_a_seed_for_a_vidur_file_with_arrival_times(tmp_path, capsys) -> None:
    """vidur with arrived_at, --qps 4 --seed 3 and --seed 4 wrote the same trace: the recorded arrivals are rescaled,
    none drawn, and the seed was accepted and unread (the earlier check caught only vidur without --qps)."""
    from tests.traces.helpers import cli_error

    src = tmp_path / "v.csv"
    src.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,0\n20,5,1\n30,5,1.5\n")
    out = tmp_path / "v.parquet"
    argv = ["vidur", str(src), "-o", str(out), "--qps", "4"]
    assert cli_error(convert_main, [*argv, "--seed", "3"], capsys) == (
        f"error: {src}: --seed 3: the file records its arrival times (vidur's arrived_at), so none are drawn and it "
        "would change nothing; convert without --seed")
    assert not out.exists()
    assert convert_main(argv) == 0
    # Without arrived_at the arrivals are drawn, and --seed 0 is the default's draw.
    src.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n20,5\n30,5\n")
    assert convert_main([*argv, "--overwrite"]) == 0
    assert convert_main(["vidur", str(src), "-o", str(tmp_path / "0.parquet"), "--qps", "4", "--seed", "0"]) == 0
    assert pl.read_parquet(out).equals(pl.read_parquet(tmp_path / "0.parquet"))
