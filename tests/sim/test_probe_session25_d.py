"""Session 25, probe D: interruption and the file system. A signal while the interpreter freed its modules after a
complete run (status 143 and no line, or 130 and no line for the commands that ended with sys.exit); an --out that
is a symbolic link loop, a path with a name past 255 bytes, or a full disk while polars wrote a parquet file: each
a traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import analysis.runs
from cli.sim_replay import main as replay_main
from sim.calibrate import main as calibrate_main
from sim.files import write_parquet_frame
from sim.fit_profile import main as fit_profile_main
from tests.sim.helpers import REPO, SHAREGPT
from tests.traces.helpers import cli_error, link_loop
from traces.info import main as info_main

# A command run as python -m runs it, with an object freed only as the interpreter clears its modules (after the exit
# handlers, once it has reset the signal handlers written in Python to the default): it sends the signal then.
_SIGNAL_AT_TEARDOWN = """
import os, runpy, signal, sys, time

SIGNUM = getattr(signal, sys.argv[1])

class SignalAtTeardown:
    def __del__(self):
        os.kill(os.getpid(), SIGNUM)
        time.sleep(0.5)

late = SignalAtTeardown()
module = sys.argv[2]
sys.argv = ["-m", *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["sim.replay", "traces.synth"])
def test_a_signal_while_the_modules_are_freed_leaves_the_status_alone(tmp_path, signame, command):
    """sim.replay: SIGTERM there killed the process (status 143, no line) over a complete run folder. traces.synth
    (and every command that ended with sys.exit(main())): Ctrl-C gave 130 and SIGTERM 143, with no line."""
    if command == "sim.replay":
        out = tmp_path / "run"
        args = [str(SHAREGPT), "--limit", "3", "--out", str(out), "--quiet", "--no-report"]
    else:
        out = tmp_path / "t.parquet"
        args = ["-o", str(out), "--num-requests", "5", "--qps", "1"]
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT_TEARDOWN, signame, command, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (proc.returncode, proc.stderr) == (0, "")
    assert out.exists()


def test_an_out_that_is_a_symbolic_link_loop_is_one_line(tmp_path, capsys):
    """RuntimeError: Symlink loop from '...' (Path.resolve in analysis.outdir), status 1."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for out in (tmp_path / "a", tmp_path / "a" / "run"):
        line = cli_error(replay_main, [str(SHAREGPT), "--limit", "3", "--out", str(out), "--quiet"], capsys)
        assert line == f"error: --out {out}: a symbolic link loop; expected a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_calibrate_and_fit_profile_given_a_symbolic_link_loop_are_one_line(tmp_path, capsys):
    """Both resolved each path to find one given twice: RuntimeError: Symlink loop, a traceback."""
    loop = link_loop(tmp_path, "a", "b")
    expected = f"error: {loop}: cannot read the profile (a symbolic link loop)"  # was "no such file" (session 44)
    assert cli_error(calibrate_main, [str(loop), str(loop)], capsys) == expected
    assert cli_error(fit_profile_main, [str(loop)], capsys) == expected


def test_a_full_disk_while_polars_writes_is_an_oserror(tmp_path):
    """polars raised its own ComputeError ('... underlying IO error: No space left on device (os error 28)'), which
    no command's OSError handling caught."""
    with pytest.raises(OSError) as raised:
        write_parquet_frame(pl.DataFrame({"x": list(range(100_000))}), Path("/dev/full"))
    assert raised.value.errno == errno.ENOSPC


def test_replay_on_a_full_disk_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """sim.replay --out on a full disk: a polars ComputeError traceback, status 1."""
    def onto_a_full_disk(frame, path, **options):
        write_parquet_frame(frame, Path("/dev/full"), **options)

    monkeypatch.setattr(analysis.runs, "write_parquet_frame", onto_a_full_disk)
    out = tmp_path / "run"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "50", "--out", str(out), "--quiet", "--no-report"], capsys)
    assert line == f"error: --out {out}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_a_name_past_255_bytes_is_one_line(tmp_path, capsys):
    """Path.exists() and is_file() raise OSError on a name too long (Python 3.11 passes over only a missing file):
    a trace, a run folder or a cost model given so was a traceback, status 1."""
    long = tmp_path / ("c" * 300)
    why = "File name too long; expected a path whose names are at most 255 bytes each (4096 in all)"
    assert cli_error(replay_main, [str(long), "--out", str(tmp_path / "run")], capsys) == f"error: {long}: {why}"
    argv = [str(SHAREGPT), "--limit", "3", "--cost-model", str(long), "--out", str(tmp_path / "run")]
    assert cli_error(replay_main, argv, capsys) == f"error: {long}: {why}"
    assert cli_error(info_main, [str(long / "t.parquet")], capsys) == f"error: {long / 't.parquet'}: {why}"
    assert cli_error(calibrate_main, [str(SHAREGPT), str(long)], capsys) == f"error: {long / 'steps.parquet'}: {why}"
    assert list(tmp_path.iterdir()) == []
