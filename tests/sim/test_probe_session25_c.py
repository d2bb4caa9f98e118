"""Session 25, probe C: hostile input and signals to sim.replay's advanced options (--bands, --host-slowdown,
--router, --cost-model): hangs, tracebacks, wrong exit codes."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from analysis.capacity.executors import default_num_jobs
from tests.signals import signal_group_after
from tests.sim.helpers import SHAREGPT

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(default_num_jobs() < 2, reason="the band replays run in a pool only with two cores or more")
@pytest.mark.parametrize("delay_s", [0.0, 0.4, 0.8, 1.2])
def test_sigterm_to_the_process_group_while_the_band_pool_starts_stops_the_replay(tmp_path, delay_s):
    """`timeout` and supervisors send SIGTERM to the whole process group: a band worker still importing died of it
    while the replay wrote the trace (its start-up data, a third of a megabyte here) into the worker's pipe, which
    no one read any more: sim.replay --bands hung until killed (SIGTERM again did nothing)."""
    out = tmp_path / "out"
    # The whole trace and eight replays: the band pool's work must outlast the longest delay (500 requests and four
    # replays finished within 1.2 s once band replays built no step table and priced windows in passes).
    status, stderr, elapsed_s = signal_group_after(
        [sys.executable, "-m", "sim.replay", str(SHAREGPT), "--out", str(out), "--no-report", "--bands", "8"],
        b"bands:", delay_s, signal.SIGTERM, REPO_ROOT, exit_timeout_s=10)  # "bands:": the pool is being started now
    assert status == 143
    assert stderr.splitlines()[-1] == f"interrupted: nothing written to {out}" and "Traceback" not in stderr
    assert elapsed_s < 2.0, f"took {elapsed_s:.1f} s to stop"
    assert not out.exists()


@pytest.mark.parametrize("profile", ["", " "])
def test_host_speed_refuses_an_empty_profile_option(tmp_path, capsys, profile):
    """--profile "" was Path(""), the current folder: the line named a folder nobody typed ("cost model .: not a
    readable profile (IsADirectoryError ...)"), as decode_fits and step_errors no longer do."""
    from sim.host_speed import main as host_speed_main
    from tests.traces.helpers import cli_error

    line = cli_error(host_speed_main, [str(tmp_path), "--profile", profile, "--out", str(tmp_path / "t.csv")], capsys)
    assert line == "error: argument --profile: is empty; name a file (--help lists the options)"
    assert list(tmp_path.iterdir()) == []
