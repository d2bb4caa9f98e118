"""A command whose reader goes away (``python -m sim.replay TRACE | head -1``) finishes its work with its status,
without a BrokenPipeError traceback: it ended with status 1 between writing its outputs and the lines about them
(probe I, session 26)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"


def _run_with_stdout_closed(args: list[str]) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    process.stdout.close()  # the reader is gone before the command prints a line
    stderr = process.stderr.read()
    return subprocess.CompletedProcess(args, process.wait(timeout=600), "", stderr)


@pytest.mark.parametrize("extra", [["--quiet"], []], ids=["quiet", "with-progress"])
def test_sim_replay_writes_its_outputs_and_exits_0(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "run"
    done = _run_with_stdout_closed(["-m", "sim.replay", str(SHAREGPT), "--limit", "50", "--no-report", "--out",
                                    str(out), *extra])
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 0
    assert sorted(path.name for path in out.iterdir()) == ["requests.parquet", "steps.parquet", "summary.json"]


def test_traces_info_exits_0(tmp_path: Path) -> None:
    done = _run_with_stdout_closed(["-m", "traces.info", str(SHAREGPT)])
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0
