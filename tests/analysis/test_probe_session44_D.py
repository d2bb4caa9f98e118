"""Session 44 (helper D) hostile-input probes of the analysis commands: a process pool's workers outlived a parent
killed with SIGKILL, a run folder behind a symbolic link loop was "does not exist", and --metric-percentiles -0 was
listed as -0.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.runs import read_metric_percentiles
from analysis.summarize import main as summarize_main
from analysis.vllm_metrics import parse_metric_percentiles
from tests.traces.helpers import link_loop

REPO = Path(__file__).resolve().parents[2]

# Starts a two-worker pool as the capacity sweep and --bands do, prints its workers' ids and dies by SIGKILL, which no
# process can act on: only the workers themselves can notice.
KILLED_POOL_OWNER = """
import os, signal, time
from analysis.process_pools import spawn_pool
pool = spawn_pool(2, time.sleep, (0,))
for future in [pool.submit(time.sleep, 0.5) for _ in range(2)]:
    future.result()
print(*pool._processes, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (dead, not yet reaped by whoever adopted it) does not."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's (prctl)")
def test_pool_workers_end_when_their_parent_is_killed() -> None:
    # Its output read up to its line only: the workers hold the pipe too, and reading to its end waits for them.
    owner = subprocess.Popen([sys.executable, "-c", KILLED_POOL_OWNER], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    with owner.stdout:
        workers = [int(pid) for pid in owner.stdout.readline().split()]
    assert owner.wait(timeout=120) == -9
    assert len(workers) == 2
    try:
        deadline = time.monotonic() + 10
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_running, workers))  # they waited for work forever
    finally:
        for pid in filter(_running, workers):
            os.kill(pid, 9)


def test_a_run_folder_behind_a_link_loop_is_named_so(tmp_path: Path, capsys) -> None:
    loop = link_loop(tmp_path, "run", "other")
    with pytest.raises(SystemExit) as exited:
        summarize_main([str(loop)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: {loop} is a symbolic link loop; expected a replay output folder\n"


def test_minus_zero_is_the_percentile_zero(tmp_path: Path) -> None:
    assert json.dumps(parse_metric_percentiles("-0,50")) == "[0.0, 50.0]"
    (tmp_path / "summary.json").write_text(json.dumps({"metric_percentiles": [-0.0, 50]}))
    assert json.dumps(read_metric_percentiles(tmp_path)) == "[0.0, 50.0]"
