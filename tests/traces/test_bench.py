"""``python -m traces.bench`` against a fake OpenAI-compatible streaming server on a loopback port: the exact
request bodies, arrival pacing, the latencies the client records, failure reporting, bad input."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from cli.traces_bench import main as bench_main
from engine.core.model_config import ModelShape
from tests.traces.fake_openai import FakeOpenAI
from traces.schema import load_trace, save_trace

REPO = Path(__file__).resolve().parents[2]
QWEN_VOCAB = ModelShape.load("qwen3-0.6b").vocab_size  # what sim.replay's default model draws prompt ids from
TTFT_S, ITL_S = 0.05, 0.02


def _trace(tmp_path: Path, arrivals: list[float], outputs: list[int], prompts: list[int] | None = None,
           hash_ids: list[list[int]] | None = None) -> Path:
    n = len(arrivals)
    columns = {"request_id": [f"r{i}" for i in range(n)], "arrival_s": arrivals,
               "prompt_tokens": prompts or [5 + 3 * i for i in range(n)], "output_tokens": outputs}
    if hash_ids is not None:
        columns["hash_ids"] = hash_ids
    path = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame(columns), path, hash_block_size=4 if hash_ids is not None else None)
    return path


def _bench(server: FakeOpenAI, trace: Path, out: Path, *extra: str) -> int:
    return bench_main([server.url, str(trace), "--out", str(out), "--quiet", "--no-report", *extra])


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert lines and lines[-1].startswith("error: "), stderr
    assert [line for line in lines if not line.startswith("usage:")][-1] == lines[-1]
    return lines[-1]


def test_request_bodies_are_the_replays_prompts(tmp_path) -> None:
    """Token-id prompts of the trace's exact lengths, the same ids sim.replay queues (shared hash ids give
    shared prefixes, so the same requests hit the prefix cache), max_tokens and ignore_eos as the trace asks."""
    hash_ids = [[1, 2], [1, 2, 3], [7]]
    trace_path = _trace(tmp_path, [0.0, 0.1, 0.2], [3, 1, 4], prompts=[8, 10, 3], hash_ids=hash_ids)
    with FakeOpenAI() as server:
        assert _bench(server, trace_path, tmp_path / "out", "--model", "qwen3-0.6b") == 0
    trace = load_trace(trace_path)
    bodies = sorted((r.body for r in server.received), key=lambda body: body["max_tokens"])
    by_tokens = {body["max_tokens"]: body for body in bodies}
    for row, max_tokens in enumerate([3, 1, 4]):
        body = by_tokens[max_tokens]
        assert body["prompt"] == trace.prompt_token_ids(row, QWEN_VOCAB, 0)
        assert len(body["prompt"]) == [8, 10, 3][row]
        assert {k: v for k, v in body.items() if k != "prompt"} == {
            "model": "qwen3-0.6b", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}
    assert by_tokens[1]["prompt"][:8] == by_tokens[3]["prompt"]  # the shared blocks [1, 2]


def test_arrivals_are_paced_and_latencies_recorded(tmp_path) -> None:
    trace_path = _trace(tmp_path, [10.0, 10.4, 10.8, 12.0], [1, 5, 2, 3])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=TTFT_S, itl_s=ITL_S) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "1000", "--time-scale", "0.5") == 0
    # Sent on the rescaled schedule (gaps halved): never early, and late by less than the loop's jitter.
    received = sorted(r.at_s for r in server.received)
    offsets = [at - received[0] for at in received]
    for offset, expected in zip(offsets, [0.0, 0.2, 0.4, 1.0]):
        assert expected - 0.01 <= offset <= expected + 0.15, offsets
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["request_id"].to_list() == ["r0", "r1", "r2", "r3"]
    assert requests["finish_reason"].to_list() == ["length"] * 4
    assert requests["output_tokens"].to_list() == [1, 5, 2, 3]
    assert requests["prompt_tokens"].to_list() == [5, 8, 11, 14]
    # Arrivals on the trace's clock (first arrival 10 s), sent when the rescaled trace says.
    assert requests["scheduled_arrival_s"].to_list() == pytest.approx([10.0, 10.2, 10.4, 11.0])
    sent = requests["arrival_s"].to_list()
    assert all(s - 0.001 <= a <= s + 0.15 for a, s in zip(sent, [10.0, 10.2, 10.4, 11.0])), sent
    for row in requests.iter_rows(named=True):
        times = row["token_times_s"]
        assert len(times) == row["output_tokens"]
        assert TTFT_S <= row["ttft_s"] < TTFT_S + 0.3
        # The server sleeps TTFT, then ITL between tokens, so token k is never received before TTFT + k ITLs after
        # the request was sent. Measured from the first token it can be: the client may read that one late, then the
        # next at once (a loaded machine: 17.5 ms after it, with ITL 20 ms).
        assert all(t - row["arrival_s"] >= (TTFT_S + k * ITL_S) * 0.9 for k, t in enumerate(times)), times
        assert all(b - a < ITL_S + 0.2 for a, b in zip(times, times[1:])), times
        assert row["e2e_s"] == pytest.approx(times[-1] - row["arrival_s"])
        assert row["e2e_s"] >= TTFT_S + (row["output_tokens"] - 1) * ITL_S * 0.9
        # A client cannot know these: null, never 0.
        assert row["first_scheduled_s"] is None and row["num_preemptions"] is None
        assert row["cached_tokens"] is None and row["queue_s"] is None and row["error"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == summary["completed"] == 4
    assert summary["prefix_cache_hit_rate"] is None and summary["num_preemptions"] is None
    assert summary["num_steps"] is None and summary["queue_ms"]["p50"] is None
    assert summary["mean_ttft_ms"] == pytest.approx(requests["ttft_s"].mean() * 1e3, rel=1e-5)
    assert summary["config"]["model"] == "fake-model"  # the server's first model, as vllm bench serve takes it
    assert sorted(p.name for p in out.iterdir()) == ["requests.parquet", "steps.parquet", "summary.json"]
    assert pl.read_parquet(out / "steps.parquet").height == 0


def test_usage_counts_and_chunk_counts(tmp_path) -> None:
    """Without a usage chunk the output is the chunks counted and the prompt the trace's; with usage, its
    counts and cached tokens (vLLM reports them in prompt_tokens_details)."""
    trace_path = _trace(tmp_path, [0.0, 0.0], [2, 3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, send_usage=False) as server:
        assert _bench(server, trace_path, tmp_path / "plain", "--vocab-size", "50", "--offline") == 0
    plain = pl.read_parquet(tmp_path / "plain" / "requests.parquet")
    assert plain["output_tokens"].to_list() == [2, 3] and plain["prompt_tokens"].to_list() == [5, 8]
    with FakeOpenAI(ttft_s=0.0, itl_s=0.0, cached_tokens=4) as server:
        assert _bench(server, trace_path, tmp_path / "usage", "--vocab-size", "50", "--offline") == 0
    usage = pl.read_parquet(tmp_path / "usage" / "requests.parquet")
    assert usage["cached_tokens"].to_list() == [4, 4]
    summary = json.loads((tmp_path / "usage" / "summary.json").read_text())
    assert summary["prefix_cache_hit_rate"] == pytest.approx(8 / 13, rel=1e-5)


def test_a_finish_only_chunk_is_no_token(tmp_path) -> None:
    """A server that sends the finish reason in a chunk of its own: the request ends at that chunk, its token times
    are the usage's count (one more was refused by analysis.summarize and compare as impossible)."""
    trace_path = _trace(tmp_path, [0.0, 0.0], [2, 3])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.01, finish_chunk=True) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50", "--offline") == 0
    rows = pl.read_parquet(tmp_path / "out" / "requests.parquet").sort("output_tokens")
    assert rows["output_tokens"].to_list() == [2, 3]
    assert [len(t) for t in rows["token_times_s"].to_list()] == [2, 3]
    for times, finish in zip(rows["token_times_s"].to_list(), rows["finish_s"].to_list()):
        assert finish > times[-1]  # the finish chunk came one gap after the last token
    summary = subprocess.run([sys.executable, "-m", "analysis.summarize", str(tmp_path / "out")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert summary.returncode == 0, summary.stderr


def test_max_concurrency_bounds_requests_in_flight(tmp_path) -> None:
    trace_path = _trace(tmp_path, [0.0] * 6, [3] * 6)
    with FakeOpenAI(ttft_s=0.05, itl_s=0.01) as server:
        assert _bench(server, trace_path, tmp_path / "one", "--vocab-size", "50", "--max-concurrency", "2") == 0
    assert server.max_in_flight == 2 and len(server.received) == 6
    with FakeOpenAI(ttft_s=0.05, itl_s=0.01) as server:
        assert _bench(server, trace_path, tmp_path / "all", "--vocab-size", "50") == 0
    assert server.max_in_flight == 6


def test_failed_requests_are_reported(tmp_path, capsys) -> None:
    """400 and 500 answers and a dropped connection: each request marked "error" with its reason, a report of
    the failures, the finished ones still timed; exit 0 while any request succeeded, 1 when none did."""
    trace_path = _trace(tmp_path, [0.0, 0.05, 0.1, 0.15], [2, 7, 8, 9])
    out = tmp_path / "out"
    with FakeOpenAI(failures={7: "400", 8: "500", 9: "drop"}) as server:
        assert _bench(server, trace_path, out, "--vocab-size", "50") == 0
    stderr = capsys.readouterr().err
    report = stderr[stderr.index("3 of 4 requests failed"):].splitlines()
    assert report[0] == "3 of 4 requests failed; first errors:"
    assert report[1] == "  request 'r1': HTTP 400: prompt too long"
    assert report[2] == "  request 'r2': HTTP 500: Internal Server Error"
    assert report[3].startswith("  request 'r3': ClientPayloadError: ")
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests["finish_reason"].to_list() == ["length", "error", "error", "error"]
    assert requests["error"].to_list()[:3] == [None, "HTTP 400: prompt too long", "HTTP 500: Internal Server Error"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_failed"] == 3 and summary["completed"] == 1 and summary["failed"] == 3
    with FakeOpenAI(failures={2: "500", 7: "500", 8: "500", 9: "500"}) as server:
        assert _bench(server, trace_path, tmp_path / "none", "--vocab-size", "50") == 1
    assert "4 of 4 requests failed" in capsys.readouterr().err


def test_per_request_timeout(tmp_path, capsys) -> None:
    trace_path = _trace(tmp_path, [0.0], [50])
    with FakeOpenAI(ttft_s=0.0, itl_s=0.1) as server:
        assert _bench(server, trace_path, tmp_path / "out", "--vocab-size", "50", "--request-timeout-s", "0.3") == 1
    assert "no complete answer within the per-request timeout of 0.3 s" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(("args", "expected"), [
    (["ftp://127.0.0.1:1", "{trace}"], "URL 'ftp://127.0.0.1:1': expected http://HOST:PORT"),
    (["http://[::1", "{trace}"], "URL 'http://[::1': expected http://HOST:PORT"),  # was 'Invalid IPv6 URL'
    (["{url}", "{trace}", "--max-concurrency", "0"], "--max-concurrency must be >= 1, got 0"),
    (["{url}", "{trace}", "--request-timeout-s", "nan"], "--request-timeout-s must be a finite number > 0"),
    # a server (ours) refuses it: every request failed (exit 1), after the run had been sent whole
    (["{url}", "{trace}", "--temperature", "1e308"], "--temperature must be a number from 0 to 3.4e+38, got 1e+308"),
    (["{url}", "{trace}", "--prompt-format", "text"], "--prompt-format text needs --tokenizer PATH"),
    (["{url}", "{trace}", "--slo", "ttft=2s"], "--slo: cannot parse SLO 'ttft=2s'"),
    (["{url}", "{tmp}/missing.parquet"], "missing.parquet: cannot read the trace: no such file"),
    (["{url}", "{trace}", "--qps", "0"], "--qps must be > 0"),
    # waited 31 years for the second request (engine.replay refused it)
    (["{url}", "{trace}", "--time-scale", "1e9"], "{trace}: the arrivals span 1e+09 s after --qps/--time-scale; a "
     "real-time replay is limited to 2,592,000 s (30 days): use --qps or --time-scale"),
    (["{url}", "{trace}", "--model", "no-such-model"], "cannot tell the vocabulary of model 'no-such-model'"),
    # read as no --model: the server's first model was benched without a word
    (["{url}", "{trace}", "--model", " "], "--model is empty; expected the served model's name"),
    (["{dead}", "{trace}"], "/v1/models: cannot reach the server"),
    (["http://127.0.0.1:99999", "{trace}"], "the port must be a number from 0 to 65535"),  # was aiohttp's InvalidUrl
    # /v1/models and --endpoint are appended to it: each was a bare 404 from ".../v1/completions/v1/models"
    (["{url}/v1/completions", "{trace}"], "expected the server's base URL, such as http://HOST:PORT or "
     "http://HOST:PORT/v1 (a path prefix of a proxy is fine), without a query, a fragment or an endpoint"),
    (["{url}?x=1", "{trace}"], "without a query, a fragment or an endpoint"),
    (["{url}/v1#top", "{trace}"], "without a query, a fragment or an endpoint"),
    (["{url}", "{trace}", "--out", "{trace}"], "is or holds the input"),
    # every request failed on 'http://127.0.0.1:PORTv1/completions', and the run was written
    (["{url}", "{trace}", "--endpoint", "v1/completions"],
     "--endpoint 'v1/completions': expected a path that starts with '/', such as /v1/completions"),
    # the client sends completions bodies: every request was a 400, the run written and exit 1
    (["{url}", "{trace}", "--endpoint", "/v1/chat/completions"],
     "--endpoint '/v1/chat/completions': a chat endpoint takes messages, and this client sends completions requests"),
    # a TypeError traceback from transformers
    (["{url}", "{trace}", "--prompt-format", "text", "--tokenizer", "{trace}"],
     "--tokenizer {trace}: is a file; expected a Hugging Face tokenizer directory or name"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, expected) -> None:
    trace_path = _trace(tmp_path, [0.0, 1.0], [2, 2])
    with FakeOpenAI() as server:
        values = {"url": server.url, "trace": str(trace_path), "tmp": str(tmp_path),
                  "dead": f"http://127.0.0.1:{_free_port()}"}
        argv = [arg.format(**values) for arg in args]
        if "--out" not in argv:
            argv += ["--out", str(tmp_path / "out")]
        proc = subprocess.run([sys.executable, "-m", "traces.bench", *argv, "--quiet"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert expected.format(**values) in _error_line(proc.stderr)
    assert not (tmp_path / "out").exists()


def test_a_prompt_longer_than_any_context_is_refused_before_any_request(tmp_path) -> None:
    """The ids of a 1e10-token prompt asked numpy for 128 GiB: a MemoryError traceback after the server was asked
    for its model (engine.replay rejects such a request)."""
    trace_path = _trace(tmp_path, [0.0, 1.0], [2, 2], prompts=[5, 10**10])
    with FakeOpenAI() as server:
        proc = subprocess.run([sys.executable, "-m", "traces.bench", server.url, str(trace_path), "--out",
                               str(tmp_path / "out"), "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert server.received == []
    assert proc.returncode == 2 and proc.stderr == (
        f"error: {trace_path}: row 1 (request_id 'r1'): column 'prompt_tokens' is 10,000,000,000; traces.bench sends "
        "prompts of at most 16,777,216 tokens (no model's context holds more)\n")
    assert not (tmp_path / "out").exists()


def test_a_server_that_never_answers_is_named_with_the_timeout() -> None:
    """A port that accepts but never answers ended in 'cannot reach the server (TimeoutError: )'."""
    import asyncio

    from traces.http_bench import first_model

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(ValueError, match=r"/v1/models: cannot reach the server \(no answer within 0.3 s\)"):
            asyncio.run(first_model(url, timeout_s=0.3))


def test_a_malformed_event_fails_its_request_not_the_run() -> None:
    """'choices' as an object was a KeyError traceback out of the whole replay; a usage count that is no count
    (true, -1) was kept and failed the run's write after every request had been sent."""
    from traces.http_bench import BenchResult, _on_event

    result = BenchResult(request_id="r", scheduled_s=0.0)
    with pytest.raises(ValueError, match=r"^'choices' is not a list: "):
        _on_event('{"choices": {"0": {"finish_reason": "length"}}}', result, 1.0)
    _on_event('{"choices": [{"finish_reason": null}], "usage": {"prompt_tokens": true, "completion_tokens": -1, '
              '"prompt_tokens_details": {"cached_tokens": 100000000000000000000}}}', result, 2.0)
    assert (result.prompt_tokens, result.output_tokens, result.cached_tokens) == (None, None, None)
    _on_event('{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}', result, 3.0)
    assert (result.prompt_tokens, result.output_tokens, result.chunk_times_s) == (7, 3, [2.0])


def test_a_model_listing_whose_data_is_no_list_is_one_line() -> None:
    """{"data": {...}} was a KeyError traceback (models[0] on a dict)."""
    import asyncio

    from traces.http_bench import first_model

    class OddListing(FakeOpenAI):
        async def _models(self, request):
            from aiohttp import web

            return web.json_response({"data": {"id": "m"}})

    with OddListing() as server, pytest.raises(ValueError, match=r"/v1/models: the server lists no model; pass "
                                                                   r"--model$"):
        asyncio.run(first_model(server.url))


def test_ctrl_c_stops_promptly_and_writes_nothing(tmp_path) -> None:
    trace_path = _trace(tmp_path, [0.0, 0.1, 30.0], [200, 200, 200])
    out = tmp_path / "out"
    with FakeOpenAI(ttft_s=0.0, itl_s=0.5) as server:
        proc = subprocess.Popen([sys.executable, "-m", "traces.bench", server.url, str(trace_path), "--vocab-size",
                                 "50", "--out", str(out), "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while len(server.received) < 2 and time.monotonic() < deadline:  # both streams are running
                time.sleep(0.05)
            assert len(server.received) == 2, proc.communicate(timeout=5)
            interrupted = time.perf_counter()
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=20)
            elapsed_s = time.perf_counter() - interrupted
        finally:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted: nothing written to {out}"
    assert elapsed_s < 2.0
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_without_aiohttp_the_error_says_what_to_install(tmp_path) -> None:
    code = ("import sys; sys.modules['aiohttp'] = None\n"  # an interpreter where aiohttp cannot be imported
            "from cli.traces_bench import main\n"
            f"sys.exit(main(['http://127.0.0.1:1', {str(tmp_path / 't.parquet')!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: traces.bench needs aiohttp; install it (pip install -e '.[bench]')"
