"""The server's lifecycle and concurrency over a real uvicorn on a loopback port (a scripted engine process, no torch):
what a client that leaves, or a server that stops, leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from engine.server.api import build_app  # noqa: E402
from engine.server.engine_client import EngineClient  # noqa: E402
from engine.server.signals import Server  # noqa: E402
from tests.engine import test_server_api  # noqa: E402
from tests.engine.helpers import engine_processes, killed_on_exit, process_cmdline, serve_process  # noqa: E402
from tests.engine.test_server_api import ScriptedRunner, scripted_llm, wait_until_idle  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient


@contextlib.contextmanager
def live_server(runner_kwargs: dict | None = None, **config):
    """uvicorn serving the app over a scripted engine process in a thread; yields (base URL, engine client)."""
    engine = EngineClient(functools.partial(scripted_llm, ScriptedRunner, runner_kwargs or {}, config), model_name="m",
                          max_waiting_requests=100)
    engine.start(timeout_s=60)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = Server(uvicorn.Config(build_app(engine), log_level="warning", timeout_graceful_shutdown=5))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    finally:
        server.should_exit = server.force_exit = True
        serving.join(timeout=30)
        sock.close()
        engine.stop()


def _tasks_running(engine: EngineClient, name: str) -> int:
    """How many tasks of the server's event loop run the coroutine ``name``."""
    async def count() -> int:
        return sum(1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == name)
    return asyncio.run_coroutine_threadsafe(count(), engine._loop).result(timeout=5)


def _running(url: str) -> float:
    line = next(x for x in httpx.get(f"{url}/metrics").text.splitlines() if x.startswith("vllm:num_requests_running"))
    return float(line.split()[-1])


def test_a_whole_request_whose_client_left_leaves_no_task_behind() -> None:
    """A non-streamed request reads its updates in a task the handler cancels when the client goes away. On Python
    3.11 asyncio.wait_for swallows a cancel that lands as an update arrives: the task then waited on a stream the
    server had dropped, waking each second for the server's life (one per client that left), and when the engine
    stopped it failed with "Task exception was never retrieved" and a traceback in the log."""
    with live_server({"step_s": 0.002}) as (url, engine):
        for _ in range(6):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 240, "ignore_eos": True},
                           timeout=0.3)
        deadline = time.monotonic() + 10
        while _running(url) or _tasks_running(engine, "_consume"):
            assert time.monotonic() < deadline, f"{_tasks_running(engine, '_consume')} reader tasks left behind"
            time.sleep(0.05)


def test_a_whole_request_that_failed_aborts_its_other_choices(served) -> None:
    """One prompt of a request failed in the engine: the client got its 500 at once, but a non-streamed request left
    its other choices running to their end (a stream aborted them), holding their blocks and steps for nobody."""
    client = served(runner_kwargs={"fail_token": 13, "step_s": 0.005})
    r = client.post("/v1/completions", json={"prompt": [[13, 1], [1, 2]], "max_tokens": 200, "ignore_eos": True})
    assert r.status_code == 500 and "scripted failure" in r.json()["error"]["message"]
    m = wait_until_idle(client)
    assert m["vllm:num_requests_running"] == 0
    assert m.get("vllm:request_success_total{finished_reason=abort}") == 1
    assert "vllm:request_success_total{finished_reason=length}" not in m
    assert m["vllm:generation_tokens_total"] < 100


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_while_the_model_loads_is_one_line_and_exit_143(tiny_qwen3) -> None:
    """Ctrl-C while the model loads was one line and exit 130; SIGTERM (what systemd, Kubernetes and `timeout` send)
    killed the server without a word, its engine process left to Linux's parent-death signal."""
    model_dir, _ = tiny_qwen3
    proc = serve_process(model_dir, "--warmup-requests", "1000")
    with killed_on_exit(proc):
        deadline = time.monotonic() + 60
        engines: list[int] = []
        while not engines:  # the engine process is loading (a thousand warm-up requests: seconds on a CPU)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            engines = engine_processes(proc.pid)
            time.sleep(0.05)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, out
    assert out.strip().splitlines() == ["terminated while loading the model"], out
    assert not process_cmdline(engines[0]) or "\nState:\tZ" in Path(f"/proc/{engines[0]}/status").read_text()


def test_an_engine_that_died_leaves_no_requests_running_in_the_metrics() -> None:
    """The gauges kept the last step's values once the engine process died (a request running and two waiting, half
    the cache in use, for the server's life), the requests it failed were counted under no finished_reason, and their
    error said the process exited with "code None"."""
    with live_server({"step_s": 0.01}, max_num_seqs=1) as (url, engine):
        answers: list = []

        def ask() -> None:
            r = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": True},
                           timeout=30)
            answers.append((r.status_code, r.json()["error"]["message"]))

        clients = [threading.Thread(target=ask) for _ in range(3)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 10
        while 'vllm:num_requests_waiting{model_name="m"} 2.0' not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.02)
        engine._process.kill()
        for client in clients:
            client.join(timeout=10)
        # (it said "code None": the code was read before the process was reaped)
        assert answers == [(500, "the request failed in the engine: the engine process exited (code -9)")] * 3
        samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith("vllm:")}
    assert samples['vllm:num_requests_running{model_name="m"}'] == 0
    assert samples['vllm:num_requests_waiting{model_name="m"}'] == 0
    assert samples['vllm:kv_cache_usage_perc{model_name="m"}'] == 0
    assert samples['vllm:request_success_total{finished_reason="error",model_name="m"}'] == 3
