"""The engine process never outlives the server that started it, even one killed with SIGKILL (which cannot
stop it): on Linux it is sent SIGTERM when its parent dies and exits, here while still loading its model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = """
import functools, multiprocessing, time
from engine.server.engine_process import run_engine
if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    commands, _ = ctx.Pipe()
    _, messages = ctx.Pipe()
    loading = functools.partial(time.sleep, 120)  # a model load that takes two minutes
    engine = ctx.Process(target=run_engine, args=(loading, commands, messages), name="engine")
    engine.start()
    print(engine.pid, flush=True)
    time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited, not yet reaped by whoever adopted it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_an_engine_still_loading_exits_when_its_server_is_killed() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        engine_pid = int(server.stdout.readline())
        time.sleep(3.0)  # the engine process has imported its modules and is "loading"
        assert not _gone(engine_pid)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 15
        while not _gone(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(engine_pid), "the engine process outlived its killed server"
    finally:
        server.kill()
        server.wait(timeout=10)
