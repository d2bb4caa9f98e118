"""Probe C (session 40): sim.replay interrupted while it prints its summary to a stdout whose reader stopped reading
(``| less`` left waiting, a stalled terminal), with Python's own buffering. It printed its line, then hung: each flush
after the interrupt blocked again on that reader, a second Ctrl-C was a KeyboardInterrupt traceback, and the
interpreter's last flush at exit ignored Ctrl-C and SIGTERM alike (only SIGKILL ended it)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import polars as pl

from tests.signals import signal_once_stdout_stalls

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_replay_interrupted_on_a_stalled_stdout_ends_and_keeps_its_outputs(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "sim.replay", str(REPO_ROOT / "traces" / "sharegpt.parquet"), "--limit", "20",
            "--out", str(out), "--no-report"]
    code, stderr = signal_once_stdout_stalls(args, out, signal.SIGINT, REPO_ROOT, timeout_s=30)
    assert (code, stderr.splitlines()[-1]) == (130, f"interrupted: the outputs in {out}/ are complete; only this "
                                                    "summary was cut")
    assert pl.read_parquet(out / "requests.parquet").height == 20
