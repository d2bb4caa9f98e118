"""``python -m traces.bench`` against servers whose usage counts cannot be the stream they sent, or that do not
stream at all: the run's token counts come from the usage chunk, so a wrong count was a silent wrong figure
(TPOT, output throughput, the prefix-cache hit rate). Each such request now fails with the reason."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.traces.fake_openai import FakeOpenAI
from tests.traces.test_bench import _bench, _trace


@pytest.mark.parametrize(("usage", "expected"), [
    # 1,000 tokens for 3 streamed: TPOT came out ~300x too small, output throughput as much too large.
    ({"completion_tokens": 1000}, "the server's usage reports 1000 completion tokens, more than the 3 asked "
                                  "(max_tokens)"),
    # 0 tokens for 3 chunks: a success with no first token and no output.
    ({"completion_tokens": 0}, "the server's usage reports 0 completion tokens for 3 streamed chunks; expected at "
                               "least one token, and at most one chunk per token plus one finish-only chunk"),
    # 1 token for 3 chunks: the token times were cut to the first, the TTFT kept, the rest of the stream dropped.
    ({"completion_tokens": 1}, "the server's usage reports 1 completion tokens for 3 streamed chunks; expected at "
                               "least one token, and at most one chunk per token plus one finish-only chunk"),
    # More cached tokens than the prompt holds: a prefix-cache hit rate far above 100 %.
    ({"prompt_tokens_details": {"cached_tokens": 10**6}}, "the server's usage reports 1000000 cached prompt tokens "
                                                          "of a 5-token prompt; expected at most the prompt"),
])
def test_usage_that_cannot_be_the_stream_fails_its_request(tmp_path, capsys, usage, expected) -> None:
    trace_path = _trace(tmp_path, [0.0], [3])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, usage_override=usage) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "50") == 1
    assert f"request 'r0': {expected}" in capsys.readouterr().err
    row = pl.read_parquet(out / "requests.parquet").row(0, named=True)
    assert (row["finish_reason"], row["error"]) == ("error", expected)
    # The server's counts are not kept: the chunks seen are the output, and no cached count is claimed.
    assert (row["output_tokens"], row["cached_tokens"]) == (3, None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_failed"] == 1 and summary["prefix_cache_hit_rate"] is None


def test_usage_that_matches_the_stream_is_kept(tmp_path) -> None:
    """The counts a correct server reports (with a finish-only chunk too) are still the run's."""
    trace_path = _trace(tmp_path, [0.0], [3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, finish_chunk=True, cached_tokens=5) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 0
    row = pl.read_parquet(tmp_path / "out" / "requests.parquet").row(0, named=True)
    assert (row["finish_reason"], row["output_tokens"], row["cached_tokens"]) == ("length", 3, 5)


def test_a_server_that_does_not_stream_is_named(tmp_path, capsys) -> None:
    """One JSON body for "stream": true was reported as "the stream carried no token", with no word of why."""
    trace_path = _trace(tmp_path, [0.0], [3])
    with FakeOpenAI(json_answer=True) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 1
    assert ("request 'r0': the stream carried no token (the answer is application/json, not an event stream)"
            in capsys.readouterr().err)


def test_outputs_a_server_stopped_short_of_the_trace_are_a_warning(tmp_path, capsys) -> None:
    """A server that does not honour ignore_eos ends requests before the trace's output length (finish reason
    'stop'): they counted as plain successes, and a comparison with a simulated replay compared other requests."""
    trace_path = _trace(tmp_path, [0.0, 0.0], [3, 2])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, stop_after=2) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "50") == 0
    message = ("1 of 2 requests stopped before the output length the trace asks for (e.g. request 'r0': 2 of 3 "
               "tokens, finish reason 'stop'): the server did not honour ignore_eos, so the workload was not the "
               "trace's")
    assert f"warning [outputs_shorter_than_trace]: {message}" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["warnings"] == [{"code": "outputs_shorter_than_trace", "value": 1, "message": message}]


def test_a_server_that_honours_ignore_eos_gives_no_warning(tmp_path) -> None:
    trace_path = _trace(tmp_path, [0.0, 0.0], [3, 2])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 0
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"] == []


def test_a_run_whose_requests_all_failed_has_an_unknown_step_count(tmp_path) -> None:
    """A client sees no engine step: with every request failed (no token), the tables alone looked like an engine's
    run of 0 steps, and summary.json said num_steps 0 where it is unknown."""
    trace_path = _trace(tmp_path, [0.0, 0.0], [3, 3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, failures={3: "500"}) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50") == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["num_failed"], summary["num_steps"]) == (2, None)
