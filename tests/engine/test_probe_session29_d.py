"""Probe D of session 29: the HTTP server under a serving engineer's load test (clients that leave mid-stream or
mid-request, 200 concurrent requests, prompts that never fit, max_tokens past the context, n, stop strings, token-id
and batched prompts, SIGTERM and SIGINT with requests in flight, /health, /v1/models and /metrics under load), checked
against vLLM's OpenAI server. Found and fixed:

- A client still sending its request body when the server shuts down (a slow upload, or headers sent and the body not
  yet): input ``POST /v1/completions`` with ``Content-Length: 100`` and 13 bytes of body, then SIGTERM. Before: the
  shutdown waited for it past the 10 s grace period, to uvicorn's last resort (13 s), which cancelled it: the client got
  a plain-text "500 Internal Server Error" and the log "Cancel 1 running task(s), timeout graceful shutdown exceeded"
  with a CancelledError traceback. After: it is ended with the requests in the engine once the grace period is over,
  answered 503 with the reason (``Connection: close``), and the server exits then. Root cause: the server's
  ``end_requests`` ended only requests already in the engine (``EngineClient.end_open_requests``); one whose body was
  still being read (``RequestBodyLimit``) was invisible to it. Now ``build_app`` keeps those reads (``BodyReads``)
  and ``app.state.end_open_requests`` ends both.

Held as vLLM's (no change): every one of 200 concurrent requests (100 streamed, with n of 1-3) answered, with usage
and finish reasons that match their tokens and one id per stream; 80 clients that left mid-stream or mid-request
aborted in the engine, with the KV cache back to 0 % in use and nothing left in the server's tables; a prompt over
max_model_len or over the cache's blocks is a 400 that names the limit; prompt + max_tokens past max_model_len is a
400 (as vLLM), and an output cut by the cache says ``cut_by: kv_capacity``; stop strings spanning tokens cut the text
and count the tokens up to the one that completed them; SIGTERM or SIGINT with 100 requests in flight answers each
(its tokens, or a 503 / an error event then ``[DONE]`` after the grace period) and exits 0; an engine killed under
load fails every open request with a 500 and the server exits 1.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from cli.engine_serve import SHUTDOWN_END_S, SHUTDOWN_GRACE_S  # noqa: E402
from tests.engine.helpers import killed_on_exit, start_server  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")



_start = start_server


def _answer(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_a_request_whose_body_is_still_arriving_at_shutdown_is_answered_503_after_the_grace_period(tiny_qwen3) -> None:
    proc, url = _start(tiny_qwen3[0])
    with killed_on_exit(proc):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=60) as conn:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n" + b'{"prompt": [1')
            # A round trip on another connection: the server's loop has read the request's headers by its end (they
            # were in its socket's buffer first), so the shutdown meets the request open, not an idle connection.
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            answer = _answer(conn)
            answered_s = time.monotonic() - began
        out, _ = proc.communicate(timeout=60)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer  # was "HTTP/1.1 500 Internal Server Error", in plain text
    error = json.loads(body)["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]
    assert SHUTDOWN_GRACE_S - 1 < answered_s < SHUTDOWN_GRACE_S + SHUTDOWN_END_S - 1, answered_s  # not the last resort
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Cancel" not in out, out
