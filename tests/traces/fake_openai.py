"""A small OpenAI-compatible streaming server for the traces.bench tests, on a loopback ephemeral port.

It streams ``max_tokens`` one-token chunks (the first after ``ttft_s``, the others ``itl_s`` apart), then a
usage chunk and ``[DONE]``, and records every request body with the time it arrived. A request can be
made to fail by the number of tokens it asks for: see ``failures``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Received:
    body: dict
    at_s: float  # time.perf_counter() when the request arrived


@dataclass
class FakeOpenAI:
    ttft_s: float = 0.05
    itl_s: float = 0.02
    send_usage: bool = True
    cached_tokens: int | None = None  # reported in usage.prompt_tokens_details when set
    finish_chunk: bool = False  # the finish reason in a chunk of its own, with no text, after the last token
    usage_override: dict = field(default_factory=dict)  # usage fields replaced as given (a server's wrong counts)
    json_answer: bool = False  # one JSON body instead of an event stream (a server that ignores "stream": true)
    stop_after: int | None = None  # at most this many tokens, then finish reason "stop" (a server ignoring ignore_eos)
    cut_after: int | None = None  # at most this many tokens, then finish reason "length" (a server's context limit)
    cut_by: str | None = None  # sent in the choice that finishes a cut output, as our server does
    # max_tokens -> "400", "500", "drop" (the connection closes after the first token) or "context" (vLLM's 400 for a
    # request beyond the model's context)
    failures: dict[int, str] = field(default_factory=dict)
    model: str = "fake-model"
    received: list[Received] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(Received(body, time.perf_counter()))
        prompt = body["prompt"]
        failure = self.failures.get(body.get("max_tokens"))
        if failure == "400":
            return web.json_response({"error": {"message": "prompt too long", "type": "BadRequestError",
                                                "code": 400}}, status=400)
        if failure == "context":
            return web.json_response({"error": {"message": "This model's maximum context length is 40960 tokens. "
                                                "However, you requested 50000 tokens.", "type": "BadRequestError",
                                                "code": 400}}, status=400)
        if failure == "500":
            return web.Response(status=500, text="Internal Server Error")
        if self.json_answer:
            return web.json_response({"choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                                      "usage": {"completion_tokens": body["max_tokens"]}})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            num_tokens = int(body["max_tokens"])
            stops = self.stop_after is not None and self.stop_after < num_tokens
            num_tokens = self.stop_after if stops else num_tokens
            cut = self.cut_after is not None and self.cut_after < num_tokens
            num_tokens = self.cut_after if cut else num_tokens
            await asyncio.sleep(self.ttft_s)
            for i in range(num_tokens):
                if i:
                    await asyncio.sleep(self.itl_s)
                last = i == num_tokens - 1
                chunk = {"id": "cmpl-1", "object": "text_completion", "model": self.model,
                         "choices": [{"index": 0, "text": f" t{i}",
                                      "finish_reason": ("stop" if stops else "length") if last and not self.finish_chunk
                                      else None}]}
                if last and cut and self.cut_by is not None:
                    chunk["choices"][0]["cut_by"] = self.cut_by
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if last and self.finish_chunk:
                    await asyncio.sleep(self.itl_s)
                    chunk["choices"] = [{"index": 0, "text": "", "finish_reason": "length"}]
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if failure == "drop":
                    request.transport.close()
                    return response
            if self.send_usage:
                usage = {"completion_tokens": num_tokens}
                if isinstance(prompt, list):  # a text prompt's count needs a tokenizer: not reported then
                    usage["prompt_tokens"] = len(prompt)
                if self.cached_tokens is not None:
                    usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
                usage.update(self.usage_override)
                await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        finally:
            self.in_flight -= 1

    def __enter__(self) -> FakeOpenAI:
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_get("/v1/models", self._models)
            app.router.add_post("/v1/completions", self._completions)
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert started.wait(10), "the fake server did not start"
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
