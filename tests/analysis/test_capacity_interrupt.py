"""Ctrl-C during a capacity sweep stops it promptly: queued and running simulations are cancelled, the
command exits within seconds with one line, and no output folder is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ctrl_c_stops_a_sweep_within_two_seconds(tmp_path):
    out = tmp_path / "capacity"
    # Enough work for minutes: 8 configurations of the whole default trace, bisected to a fine tolerance.
    proc = subprocess.Popen(
        [sys.executable, "-m", "analysis.capacity", "traces/sharegpt.parquet", "--slo", "ttft_p90=2s",
         "--replicas", "1,2", "--max-num-seqs", "64,128,192,256", "--tolerance", "0.001", "--jobs", "2",
         "--quiet", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(8)  # the pool is up and simulating
        assert proc.poll() is None, proc.communicate()
        interrupted = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        elapsed_s = time.perf_counter() - interrupted
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted: simulations stopped, nothing written"
    assert "Traceback" not in stderr
    assert elapsed_s < 2.0, f"took {elapsed_s:.1f} s to stop"
    assert list(tmp_path.iterdir()) == []
