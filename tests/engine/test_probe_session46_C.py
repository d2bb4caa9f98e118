"""Hostile and unusual input for engine.serve, engine.replay and engine.LLM, session 46: the fixes' tests.

A SIGTERM sent to the server's whole process group (systemd's default KillMode=control-group, `timeout`,
``kill -- -PGID``) reached the engine process too, which unwound at once: the server found its engine dead, failed the
requests in flight with a 500 and exited with status 1 and "error: the engine stopped", where a SIGTERM to the server
alone drains them within the grace period and exits 0. A tensor-parallel engine's workers unwound too, and its requests
failed in their next collective ("Connection closed by peer"), with a traceback in the log.

A server whose output has no reader left (``engine.serve | head -1``, a log pipe that died) exited 1 with three
tracebacks, its "serving on" line raising a BrokenPipeError: it now serves, its lines discarded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from tests.engine.helpers import SERVING  # noqa: E402


def _stream_tokens(url: str, num_tokens: int, first_chunk: threading.Event, events: list) -> None:
    body = {"prompt": [1, 2, 3], "max_tokens": num_tokens, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: "):]
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                    first_chunk.set()
    finally:
        first_chunk.set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
@pytest.mark.parametrize(("options", "num_tokens"), [((), 48), (("--tensor-parallel-size", "2"), 16)])
def test_a_sigterm_to_the_servers_whole_group_drains_the_requests_in_flight(tiny_qwen3, options, num_tokens) -> None:
    """(Fewer tokens on two CPU processes, which decode slower: all of them well within the grace period.)"""
    model_dir, _ = tiny_qwen3
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--model", model_dir, "--device", "cpu", "--port",
                             "0", "--warmup-requests", "0", *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
    try:
        url = next(line for line in proc.stdout if line.startswith(SERVING))[len(SERVING):].strip()
        first_chunk, events = threading.Event(), []
        client = threading.Thread(target=_stream_tokens, args=(url, num_tokens, first_chunk, events), daemon=True)
        client.start()
        assert first_chunk.wait(120)
        os.killpg(proc.pid, signal.SIGTERM)
        log = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, log
        client.join(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert log == ""
    assert events[-1] == "[DONE]"
    choices = [event["choices"][0] for event in events[:-1]]
    assert sum(len(c["token_ids"]) for c in choices) == num_tokens
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_whose_output_has_no_reader_serves(tiny_qwen3) -> None:
    model_dir, _ = tiny_qwen3
    url = f"http://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--model", model_dir, "--device", "cpu", "--port",
                             url.rsplit(":", 1)[1], "--warmup-requests", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"})
    proc.stdout.close()  # the reader is gone before the server prints "serving on"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True},
                            timeout=60).json()
        proc.send_signal(signal.SIGTERM)
        stderr = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stderr == ""
    assert (answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]) == (3, "length")
