"""A server whose engine process died shuts down with exit code 1, as vLLM's does, so a supervisor restarts it; it
stayed up answering 503 for ever. --keep-alive-on-engine-death keeps the old behaviour."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
from tests.engine.helpers import engine_processes, killed_on_exit, start_server  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")



def _engine_process(server_pid: int) -> int:
    engines = engine_processes(server_pid)
    assert len(engines) == 1, engines
    return engines[0]


_start = start_server


def test_a_server_whose_engine_died_exits_1_with_the_reason(tiny_qwen3) -> None:
    proc, url = _start(tiny_qwen3[0])
    with killed_on_exit(proc):
        assert httpx.get(f"{url}/health").status_code == 200
        os.kill(_engine_process(proc.pid), signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert out.strip().splitlines()[-1] == ("error: the engine stopped (the engine process exited (code -9)), so the "
                                            "server shut down (--keep-alive-on-engine-death keeps it up, answering "
                                            "503)"), out
    assert "Traceback" not in out


def test_keep_alive_on_engine_death_answers_503_until_stopped(tiny_qwen3) -> None:
    proc, url = _start(tiny_qwen3[0], "--keep-alive-on-engine-death")
    with killed_on_exit(proc):
        os.kill(_engine_process(proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{url}/health")).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert health.status_code == 503 and "exited (code -9)" in health.json()["error"]["message"]
        assert proc.poll() is None  # still up
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
