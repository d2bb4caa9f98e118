"""Probe A, session 31: a command whose stderr or stdout cannot be written at all.

``python -m sim.replay TRACE 2>/dev/full`` (or with stderr closed, ``2>&-``) stopped at the progress bar's first write
with status 2 ("--out ...: No space left on device", blaming the output folder) or 1 (an AttributeError where Python
had no stderr), and threw the run away; ``>/dev/full`` was an OSError traceback with status 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from traces.schema import save_trace

REPO = Path(__file__).resolve().parents[1]
RUN_FILES = ["requests.parquet", "steps.parquet", "summary.json"]

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    save_trace(pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [10, 10, 10],
                             "output_tokens": [5, 5, 5]}), path)
    return path


def _run(args: list[str], *, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_stderr: bool = False):
    preexec = (lambda: os.close(2)) if close_stderr else None
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, stdout=stdout, stderr=stderr, text=True,
                          preexec_fn=preexec, timeout=300)


def test_a_replay_whose_stderr_is_full_writes_its_outputs_and_exits_0(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = _run(["sim.replay", str(trace), "--no-report", "--out", str(out)], stderr=full)
    assert done.returncode == 0
    assert sorted(path.name for path in out.iterdir()) == RUN_FILES


def test_a_replay_without_stderr_writes_its_outputs_and_exits_0(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "run"
    done = _run(["sim.replay", str(trace), "--no-report", "--out", str(out)], stderr=None, close_stderr=True)
    assert done.returncode == 0
    assert sorted(path.name for path in out.iterdir()) == RUN_FILES


def test_a_full_stdout_is_one_line_and_status_2_after_the_outputs(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = _run(["sim.replay", str(trace), "--quiet", "--no-report", "--out", str(out)], stdout=full)
        info = _run(["traces.info", str(trace)], stdout=full)
    # --quiet prints nothing: nothing was lost
    assert done.returncode == 0 and done.stderr == ""
    assert sorted(path.name for path in out.iterdir()) == RUN_FILES
    assert info.returncode == 2
    assert "Traceback" not in info.stderr
    assert info.stderr.splitlines() == ["error: cannot write to standard output (No space left on device); what the "
                                        "command printed there is incomplete"]


def test_a_closed_stdout_is_still_a_gone_reader(trace: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "traces.info", str(trace)], cwd=REPO, stderr=subprocess.PIPE,
                          text=True, preexec_fn=lambda: os.close(1), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
