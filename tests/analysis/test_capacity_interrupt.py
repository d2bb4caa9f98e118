"""Ctrl-C during a capacity sweep stops it promptly: queued and running simulations are cancelled, the
command exits within seconds with one line, and no output folder is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from analysis.capacity.executors import LocalExecutor
from analysis.capacity.point import PointJob
from analysis.capacity.workload import SessionLibrary, WorkloadParams
from analysis.process_pools import interrupts_held
from analysis.slo import parse_slos
from sim.config import SimConfig
from tests.signals import signal_group_after
from traces.schema import load_trace

REPO = Path(__file__).resolve().parents[2]
INTERRUPTED = "interrupted: simulations stopped, nothing written"
# Enough work for minutes: 8 configurations of the whole default trace, bisected to a fine tolerance.
SWEEP = [sys.executable, "-m", "analysis.capacity", "traces/sharegpt.parquet", "--slo", "ttft_p90=2s",
         "--replicas", "1,2", "--max-num-seqs", "64,128,192,256", "--tolerance", "0.001", "--jobs", "2"]


def test_ctrl_c_stops_a_sweep_within_two_seconds(tmp_path):
    out = tmp_path / "capacity"
    proc = subprocess.Popen(
        [*SWEEP, "--quiet", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(8)  # the pool is up and simulating (on a loaded machine, possibly still starting its workers)
        assert proc.poll() is None, proc.communicate()
        interrupted = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        elapsed_s = time.perf_counter() - interrupted
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == INTERRUPTED
    assert "Traceback" not in stderr
    assert elapsed_s < 2.0, f"took {elapsed_s:.1f} s to stop"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("delay_s", [0.0, 0.6])
def test_ctrl_c_to_the_process_group_while_the_workers_start_is_one_line(tmp_path, delay_s):
    # A terminal's Ctrl-C reaches every process of the group, the workers too. Sent to the sweep alone while it
    # started a worker, it cut the worker's start-up data short ("pickle data was truncated" from the worker); sent
    # to the group, a worker still importing printed its own KeyboardInterrupt traceback.
    out = tmp_path / "capacity"
    # "sweeping": the progress bar; the sweep is starting the pool's workers now
    status, stderr, elapsed_s = signal_group_after([*SWEEP, "--out", str(out)], b"sweeping", delay_s, signal.SIGINT,
                                                   REPO, start_timeout_s=120)
    assert status == 130
    assert stderr.splitlines()[-1] == INTERRUPTED and "Traceback" not in stderr and "Error" not in stderr, stderr
    assert elapsed_s < 2.0, f"took {elapsed_s:.1f} s to stop"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("block_sigint", [False, True])
def test_a_signal_inside_the_pools_own_code_is_acted_on_when_it_returns(block_sigint):
    # Raised inside concurrent.futures.wait, KeyboardInterrupt left a future's lock taken and the pool's thread (then
    # the exit, which joins it) waiting for it forever; inside submit, it left a worker half started.
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    finished = False
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_held(block_sigint=block_sigint):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # both have arrived: not acted on yet
            assert calls == []
            finished = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert finished and calls == [signal.SIGTERM]  # each handler ran once, after the block; Ctrl-C raised


def test_an_interrupted_pool_is_gone_when_close_returns():
    # Its own thread used to be left closing the pool's pipes while the interpreter exited, and Python 3.11's exit
    # hook for pools could write to a pipe just closed: "OSError: [Errno 9] Bad file descriptor" under the one line.
    library = SessionLibrary.from_trace(load_trace(REPO / "traces" / "sharegpt.parquet").head(120))
    threads = set(threading.enumerate())
    files = set(Path(tempfile.gettempdir()).glob("capacity-sessions-*"))
    executor = LocalExecutor(library, WorkloadParams(min_duration_s=600.0), parse_slos("ttft_p90=2s"), num_jobs=2)
    futures = [executor.submit(PointJob(SimConfig(cost_model="roofline"), qps, seed=0)) for qps in (1.0, 2.0, 4.0)]
    time.sleep(1.0)  # the workers are starting or simulating
    started = time.perf_counter()
    executor.close(interrupted=True)
    assert time.perf_counter() - started < 5.0
    assert set(threading.enumerate()) <= threads  # the pool's thread and its queue's are done
    assert all(future.done() for future in futures)
    assert set(Path(tempfile.gettempdir()).glob("capacity-sessions-*")) <= files  # the sessions' file is removed
