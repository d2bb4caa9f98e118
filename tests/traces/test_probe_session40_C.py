"""Probe C (session 40): traces.synth and traces.convert interrupted once their parquet is written, while they print
what it holds. They said "interrupted: nothing written" over the complete file, and with stdout blocked on a reader
that stopped reading they then hung: every flush after the interrupt blocked again on that reader."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.signals import signal_once_stdout_stalls
from traces.schema import load_trace

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_synth_interrupted_on_a_stalled_stdout_says_its_trace_is_complete_and_ends(tmp_path, signum, status):
    out = tmp_path / "t.parquet"
    args = [sys.executable, "-m", "traces.synth", "-o", str(out), "--num-requests", "50", "--qps", "5"]
    code, stderr = signal_once_stdout_stalls(args, out, signum, REPO_ROOT, timeout_s=30)
    assert (code, stderr) == (status, f"interrupted: {out} is complete; only this summary was cut\n")
    assert len(load_trace(out)) == 50


def test_convert_interrupted_on_a_stalled_stdout_says_its_trace_is_complete_and_ends(tmp_path):
    source, out = tmp_path / "azure.csv", tmp_path / "t.parquet"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                      "2023-11-16 18:15:50.9951690,396,109\n")
    args = [sys.executable, "-m", "traces.convert", "azure", str(source), "-o", str(out)]
    code, stderr = signal_once_stdout_stalls(args, out, signal.SIGINT, REPO_ROOT, timeout_s=30)
    assert (code, stderr) == (130, f"interrupted: {out} is complete; only this summary was cut\n")
    assert load_trace(out).requests["prompt_tokens"].to_list() == [374, 396]
