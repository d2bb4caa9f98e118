"""A server shutting down with requests in flight (SIGTERM, Ctrl-C): those still open when the grace period ends get
an answer that says why (a 503; a stream: an error event, then ``[DONE]``), the engine frees their blocks, and the
server exits then, not at uvicorn's own timeout, which cancelled them mid-response: a stream was cut without an end,
a whole request got a plain-text 500 ("Internal Server Error"), and the log a traceback for each."""

from __future__ import annotations

import functools
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from engine.server.api import build_app  # noqa: E402
from engine.server.engine_client import EngineClient  # noqa: E402
from engine.server.signals import Server  # noqa: E402
from tests.engine.test_server_api import ScriptedRunner, scripted_llm  # noqa: E402

GRACE_S = 0.5
LAST_RESORT_S = 4.0  # uvicorn's own timeout beyond the grace period: cancels whatever is still open
REQUEST = {"prompt": [1, 2, 3], "max_tokens": 240, "ignore_eos": True}  # 240 steps of 20 ms: ~5 s


@pytest.mark.parametrize("forced", [False, True], ids=["grace-period-over", "second-ctrl-c"])
def test_requests_open_when_the_grace_period_ends_are_answered_503_and_the_server_exits(forced) -> None:
    """A second Ctrl-C (a forced exit) ends them at once, the same way: they were cancelled with the event loop."""
    engine = EngineClient(functools.partial(scripted_llm, ScriptedRunner, {"step_s": 0.02}, {}), model_name="m",
                          max_waiting_requests=10)
    engine.start(timeout_s=60)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(build_app(engine), log_level="warning", timeout_graceful_shutdown=GRACE_S + LAST_RESORT_S)
    server = Server(config, grace_s=GRACE_S,
                    end_requests=functools.partial(engine.end_open_requests, "the server is shutting down"))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    results: dict = {}

    def whole() -> None:
        try:
            results["whole"] = httpx.post(f"{url}/v1/completions", json=REQUEST, timeout=30)
        except httpx.HTTPError as exc:
            results["whole"] = exc

    def streamed() -> None:
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json={**REQUEST, "stream": True}, timeout=30) as r:
                results["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]
        except httpx.HTTPError as exc:
            results["stream"] = exc

    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        clients = [threading.Thread(target=whole), threading.Thread(target=streamed)]
        for client in clients:
            client.start()
        while "vllm:num_requests_running{model_name=\"m\"} 2.0" not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the two requests never ran"
            time.sleep(0.02)
        began = time.monotonic()
        server.should_exit = True  # what SIGTERM or the first Ctrl-C does
        if forced:
            server.force_exit = True  # ... and a second Ctrl-C
        for client in clients:
            client.join(timeout=30)
        serving.join(timeout=30)
        took = time.monotonic() - began
    finally:
        server.should_exit = server.force_exit = True
        serving.join(timeout=30)
        sock.close()
        engine.stop()
    whole_answer, stream_lines = results["whole"], results["stream"]
    assert isinstance(whole_answer, httpx.Response), whole_answer
    assert whole_answer.status_code == 503, whole_answer.text
    assert "shutting down" in whole_answer.json()["error"]["message"]
    assert isinstance(stream_lines, list), stream_lines  # not "peer closed connection without sending complete ..."
    assert stream_lines[-1] == "data: [DONE]"
    error = json.loads(stream_lines[-2][len("data: "):])["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert not serving.is_alive() and took < (GRACE_S if forced else 0) + LAST_RESORT_S - 1, took
