"""Signals sent to a command's whole process group, as a terminal's Ctrl-C and `timeout`'s SIGTERM reach it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path


def signal_group_after(args: list[str], marker: bytes, delay_s: float, signum: int, cwd: Path, *,
                       start_timeout_s: float = 60.0, exit_timeout_s: float = 30.0) -> tuple[int, str, float]:
    """Run ``args`` in a session of its own, wait until ``marker`` shows on its stderr (it must not exit first), then
    ``delay_s`` more, send ``signum`` to its process group: (its exit status, its whole stderr, seconds from the signal
    to the exit). A command that outlives ``exit_timeout_s`` is killed (subprocess.TimeoutExpired)."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + start_timeout_s
    try:
        while marker not in b"".join(chunks):
            assert proc.poll() is None and time.monotonic() < deadline, b"".join(chunks)[-500:]
            time.sleep(0.01)
        time.sleep(delay_s)
        signalled = time.perf_counter()
        os.killpg(proc.pid, signum)
        status = proc.wait(timeout=exit_timeout_s)
        elapsed_s = time.perf_counter() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    return status, b"".join(chunks).decode(), elapsed_s


def signal_once_stdout_stalls(args: list[str], ready: Path, signum: int, cwd: Path, *,
                              timeout_s: float = 60.0) -> tuple[int, str]:
    """Run ``args`` with its stdout a pipe that is already full and never read (a reader that stopped: ``| less``
    left waiting, a stalled terminal), Python's own buffering (PYTHONUNBUFFERED unset), wait until ``ready`` exists
    (its output) and a second more, by when it is blocked printing, then send ``signum`` to its process group: (its
    exit status, its whole stderr). A command that outlives ``timeout_s`` after the signal is killed
    (subprocess.TimeoutExpired)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(args, cwd=cwd, stdout=write_end, stderr=subprocess.PIPE, env=env, start_new_session=True)
    os.close(write_end)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-500:]
            time.sleep(0.02)
        time.sleep(1.0)
        os.killpg(proc.pid, signum)
        _, stderr = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(read_end)
    return proc.returncode, stderr.decode()
