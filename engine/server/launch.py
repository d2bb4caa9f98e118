"""Start ``python -m engine.serve`` in a subprocess and wait until it serves (for tests and benchmarks).

The server prints ``serving on URL`` once it accepts requests (``--port 0`` takes a free port, so the
URL is only known from that line).
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVING_PREFIX = "serving on "  # what cli.engine_serve prints, then the URL


class ServerDidNotStart(RuntimeError):
    """The server exited or timed out before serving; the message holds its output."""


def start_server(args: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
                 log: Path | None = None, timeout_s: float = 240.0) -> tuple[subprocess.Popen, str]:
    """``python -m engine.serve --port 0 ARGS``; returns the process and its base URL. Its output keeps
    being read (and copied to ``log`` if given), so a chatty server never blocks on a full pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--port", "0", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    lines: queue.Queue = queue.Queue()
    out = log.open("w") if log is not None else None
    ready = threading.Event()  # once serving, lines only go to the log: nobody reads the queue any more

    def pump() -> None:
        try:
            for line in proc.stdout:
                if out is not None:
                    out.write(line)
                    out.flush()
                if not ready.is_set():
                    lines.put(line)
        finally:
            if out is not None:
                out.close()

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith(SERVING_PREFIX):
            ready.set()
            return proc, line[len(SERVING_PREFIX):].strip()
    proc.kill()
    proc.wait()
    raise ServerDidNotStart("the server did not start:\n" + "".join(seen))


def stop_server(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
