"""Probe N (session 26): what traces.bench measures against a server whose timing the test controls exactly.

What the probe found (a scripted aiohttp server on a loopback port, first chunk after 200 ms, then one every 50 ms):

- A server that ends its stream with a chunk carrying only the finish reason (no text) and sends no usage chunk:
  that chunk was counted as a token. A request asking 5 tokens was recorded with 6 output tokens (more than
  max_tokens) and 6 token times, the last being the finish chunk; one cut by the server after 4 tokens read as 5 of
  5, a complete "length" instead of a cut. vLLM's bench, without usage, counts the tokens of the text received: the
  empty finish chunk adds none.
- A server that streams several tokens in a chunk (its usage counts 8 tokens for 4 chunks): the run's ITL is the
  gap between chunks (as vLLM's bench has it), twice the gap between tokens that a simulated replay reports, and
  nothing said so. TPOT, from the token counts, is right.
- A server whose usage counts N tokens for N + 1 chunks, the first of which carries no text and no finish reason
  (an opening chunk, as a chat stream's role chunk): the surplus was taken to be the last chunk. The request's first
  token was that opening chunk (TTFT 20 ms where the first token came at 200 ms) and the last token's time was
  dropped.

Expected: token times are the chunks that carried tokens, one per token (the request still ends at its last chunk);
output tokens are the usage's, or without usage the chunks less a closing finish-only chunk; TTFT is the first
token's time less the send time, to within the loop's jitter. Several tokens in a chunk are a summary warning
(``tokens_bundled_in_chunks``) saying that ITL is between chunks there.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from aiohttp import web

from cli.traces_bench import main as bench_main
from traces.schema import save_trace

PROMPT_TOKENS = 6
TTFT_S, GAP_S, OPENING_S = 0.2, 0.05, 0.02
# The server's sleeps each end late by up to this on a loaded machine (the tests run beside others), and the lateness
# adds up over a stream: chunk k is bounded by k + 1 of them. Never early: each chunk is written after its sleeps.
JITTER_S = 0.05


def _token(text: str, finish: str | None = None) -> dict:
    return {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def _usage(num_tokens: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": num_tokens}}


def _tokens(num_tokens: int, finish_on_last: str | None, first_after_s: float = TTFT_S) -> list:
    return [(first_after_s if i == 0 else GAP_S, _token(f" t{i}", finish_on_last if i == num_tokens - 1 else None))
            for i in range(num_tokens)]


# Scripts by the max_tokens asked: (delay_s, event) pairs, then [DONE].
SCRIPTS = {
    # 5 tokens, then a finish-only chunk; no usage
    5: _tokens(5, None) + [(GAP_S, _token("", "length"))],
    # cut by the server after 4 of 6 tokens, the finish reason in a chunk of its own; no usage
    6: _tokens(4, None) + [(GAP_S, _token("", "length"))],
    # an opening chunk with no text, then 4 tokens, usage 4
    4: [(OPENING_S, _token(""))] + _tokens(4, "length", TTFT_S - OPENING_S) + [(0.0, _usage(4))],
    # control: 3 tokens, the finish reason on the last, usage 3
    3: _tokens(3, "length") + [(0.0, _usage(3))],
    # 8 tokens bundled two to a chunk, chunks 2 gaps apart, usage 8
    8: [(TTFT_S if i == 0 else 2 * GAP_S, _token(" a b", "length" if i == 3 else None)) for i in range(4)]
    + [(0.0, _usage(8))],
}


class ScriptedServer:
    def __init__(self) -> None:
        self.ready = threading.Event()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "scripted"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for delay_s, event in SCRIPTS[body["max_tokens"]]:
            await asyncio.sleep(delay_s)
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def __enter__(self) -> ScriptedServer:
        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/v1/completions", self._completions)
            runner = web.AppRunner(app)
            self.loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            self.ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(runner.cleanup())

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("probe_n")
    asked = sorted(SCRIPTS)
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": [f"r{n}" for n in asked], "arrival_s": [0.3 * i for i in range(len(asked))],
                             "prompt_tokens": [PROMPT_TOKENS] * len(asked), "output_tokens": asked}), trace)
    with ScriptedServer() as server:
        started = time.perf_counter()
        assert bench_main([server.url, str(trace), "--out", str(tmp_path / "out"), "--quiet", "--no-report",
                           "--vocab-size", "50"]) == 0
        assert time.perf_counter() - started < 30
    return tmp_path / "out"


@pytest.fixture(scope="module")
def rows(run) -> dict[str, dict]:
    frame = pl.read_parquet(run / "requests.parquet")
    return {row["request_id"]: row for row in frame.iter_rows(named=True)}


def _offsets_s(row: dict) -> list[float]:
    return [t - row["arrival_s"] for t in row["token_times_s"]]


def _check_times(row: dict, expected_s: list[float], finish_s: float) -> None:
    assert len(row["token_times_s"]) == len(expected_s), _offsets_s(row)
    for k, (got, expected) in enumerate(zip(_offsets_s(row), expected_s)):
        assert expected <= got < expected + (k + 1) * JITTER_S, (_offsets_s(row), expected_s)
    assert finish_s <= row["finish_s"] - row["arrival_s"] < finish_s + (len(expected_s) + 1) * JITTER_S
    assert row["ttft_s"] == pytest.approx(row["token_times_s"][0] - row["arrival_s"])


def test_a_finish_only_chunk_without_usage_is_no_token(rows) -> None:
    row = rows["r5"]
    assert (row["output_tokens"], row["finish_reason"], row["error"]) == (5, "length", None)
    _check_times(row, [TTFT_S + k * GAP_S for k in range(5)], TTFT_S + 5 * GAP_S)


def test_a_cut_output_with_a_finish_only_chunk_without_usage_is_cut(rows) -> None:
    row = rows["r6"]
    assert (row["output_tokens"], row["finish_reason"], row["error"]) == (4, "max_model_len", None)
    _check_times(row, [TTFT_S + k * GAP_S for k in range(4)], TTFT_S + 4 * GAP_S)


def test_an_opening_chunk_without_text_is_not_the_first_token(rows) -> None:
    row = rows["r4"]
    assert (row["output_tokens"], row["finish_reason"], row["error"]) == (4, "length", None)
    _check_times(row, [TTFT_S + k * GAP_S for k in range(4)], TTFT_S + 3 * GAP_S)
    assert row["ttft_s"] >= TTFT_S  # not the opening chunk's 20 ms


def test_plain_stream(rows) -> None:
    row = rows["r3"]
    assert (row["output_tokens"], row["finish_reason"], row["error"]) == (3, "length", None)
    _check_times(row, [TTFT_S + k * GAP_S for k in range(3)], TTFT_S + 2 * GAP_S)
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / 2)


def test_tokens_bundled_in_chunks_are_a_warning(run, rows) -> None:
    row = rows["r8"]
    assert (row["output_tokens"], row["finish_reason"], row["error"]) == (8, "length", None)
    _check_times(row, [TTFT_S + k * 2 * GAP_S for k in range(4)], TTFT_S + 6 * GAP_S)
    assert row["tpot_s"] == pytest.approx((row["token_times_s"][-1] - row["token_times_s"][0]) / 7)
    summary = json.loads((run / "summary.json").read_text())
    warnings = {w["code"]: w for w in summary["warnings"]}
    assert set(warnings) == {"tokens_bundled_in_chunks", "outputs_cut_by_the_server"}
    assert warnings["tokens_bundled_in_chunks"]["value"] == 1
    assert "request 'r8': 8 tokens in 4 chunks" in warnings["tokens_bundled_in_chunks"]["message"]
    assert warnings["outputs_cut_by_the_server"]["value"] == 1  # r6
    # By hand: every request finished, r6 cut; the outputs 3 + 4 + 5 + 4 + 8 tokens.
    assert (summary["num_finished"], summary["num_cut"], summary["num_failed"]) == (5, 1, 0)
    assert summary["total_output_tokens"] == 24
    assert summary["finish_reasons"] == {"length": 4, "max_model_len": 1}
    ttfts_ms = sorted(r["ttft_s"] * 1e3 for r in rows.values())
    assert summary["ttft_ms"]["mean"] == pytest.approx(sum(ttfts_ms) / 5, rel=1e-4)
    assert all(TTFT_S * 1e3 <= t < (TTFT_S + 2 * JITTER_S) * 1e3 for t in ttfts_ms), ttfts_ms
