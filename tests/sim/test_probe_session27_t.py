"""Probe T (session 27): sim.calibrate and sim.host_speed under hostile input.

What the probe found:

- A run folder whose steps.parquet was a huge sparse file (100 GB of nothing, a disk image named so) was read whole:
  sim.host_speed held the machine's memory until it was killed, and sim.calibrate first hashed all of it (to tell a
  copy of a run given twice) for minutes, then did the same. Now a file that does not end as a parquet file does is
  refused from its last bytes, in arrow's words, before any of it is read.
- ``sim.host_speed --window-s 2.3e-308`` (a window so short that a step's start over it overflows a float) was an
  OverflowError traceback; now it is the line that names the windows a timeline holds.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.host_speed import main as host_speed_main
from sim.profiled_cost_model import find_profile
from tests.sim.helpers import REPO
from tests.sim.test_calibrate import _fake_run
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")
NOT_PARQUET = ("not a readable parquet file (Parquet magic bytes not found in footer. Either the file is corrupted or "
               "this is not a parquet file.); expected an engine.replay steps.parquet")


def _limited_memory() -> None:
    """2 GiB of address space: a command that reads the sparse file whole fails there instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.parametrize("command", ["calibrate", "host_speed"])
def test_a_sparse_steps_parquet_is_refused_unread(tmp_path, command):
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    steps = run / "steps.parquet"
    with open(steps, "r+b") as f:  # sparse: no disk, and the commands read it whole (100 GB)
        f.truncate(100 * 2**30)
    argv = ([str(PROFILE), str(run)] if command == "calibrate" else
            [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv")])
    try:
        done = subprocess.run([sys.executable, "-m", f"sim.{command}", *argv], capture_output=True, text=True,
                              timeout=60, cwd=REPO, preexec_fn=_limited_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"sim.{command} was still reading a sparse 100 GB steps.parquet after 60 s")
    assert (done.returncode, done.stderr) == (2, f"error: {steps}: {NOT_PARQUET}\n")
    assert not (tmp_path / "h.csv").exists()


def test_host_speed_refuses_a_window_too_short_to_count_in(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    rows = pq.read_table(run / "steps.parquet").to_pylist()
    # The run five times over, back to back: 150 eager steps, enough for a timeline; the last starts at 4.29 s.
    rows = [{**r, "step": r["step"] + k * len(rows), "start_s": r["start_s"] + k} for k in range(5) for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), run / "steps.parquet")
    argv = [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv"), "--window-s", "2.3e-308"]
    line = cli_error(host_speed_main, argv, capsys)  # was an OverflowError traceback
    assert line == (f"error: {run / 'steps.parquet'}: column 'start_s' reaches 4.29 s, which --window-s 2.3e-308 cuts "
                    "into more than 1,000,000 windows, the most a timeline holds (use a longer window)")
    assert not (tmp_path / "h.csv").exists()
    assert host_speed_main(argv[:-2] + ["--window-s", "0.5"]) == 0  # a window that holds steps: the timeline
