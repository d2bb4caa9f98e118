"""Probe C (session 40): Ctrl-C and SIGTERM once a command's outputs are in place.

An output folder moving into place could be cut between its renames or while the run it replaced was removed: that
run was left hidden as .OUT.old-PID, and the command said "interrupted: nothing written" over the new run in place.
analysis.compare (like traces.synth, traces.convert, sim.calibrate) said the same when interrupted while it printed
its table after writing, and with its stdout blocked on a reader that stopped reading, it then hung: every flush
after the interrupt blocked again on that reader."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from analysis import outdir
from analysis.outdir import staged_out_dir
from engine.core.interrupt import InterruptedOnceWritten
from tests.analysis.test_compare_probe_fixes import gpu_run, sim_run
from tests.signals import signal_once_stdout_stalls

REPO_ROOT = Path(__file__).resolve().parents[2]


def earlier_run(path: Path) -> Path:
    path.mkdir()
    (path / "summary.json").write_text("earlier")
    return path


def replace_with_a_new_run(target: Path) -> None:
    with staged_out_dir(target, overwrite=True) as stage:
        (stage / "summary.json").write_text("new")


def test_ctrl_c_while_the_replaced_run_is_removed_leaves_the_new_run_and_nothing_hidden(tmp_path, monkeypatch):
    target = earlier_run(tmp_path / "run")
    remove = shutil.rmtree

    def removal_cut_by_ctrl_c(path, *args, **kwargs):
        if ".old-" in Path(path).name and Path(path).exists():
            os.kill(os.getpid(), signal.SIGINT)
        remove(path, *args, **kwargs)

    monkeypatch.setattr(outdir.shutil, "rmtree", removal_cut_by_ctrl_c)
    with pytest.raises(InterruptedOnceWritten) as raised:
        replace_with_a_new_run(target)
    assert str(raised.value) == f"interrupted: the outputs in {target}/ are complete; only this summary was cut"
    assert (sorted(p.name for p in tmp_path.iterdir()), (target / "summary.json").read_text()) == (["run"], "new")


def test_ctrl_c_between_the_renames_still_puts_the_new_run_in_place(tmp_path, monkeypatch):
    target = earlier_run(tmp_path / "run")
    rename = Path.rename

    def first_rename_cut_by_ctrl_c(self, to):
        if self == target:  # the earlier run set aside: the new one is not in place yet
            os.kill(os.getpid(), signal.SIGINT)
        return rename(self, to)

    monkeypatch.setattr(Path, "rename", first_rename_cut_by_ctrl_c)
    with pytest.raises(InterruptedOnceWritten):
        replace_with_a_new_run(target)
    assert (sorted(p.name for p in tmp_path.iterdir()), (target / "summary.json").read_text()) == (["run"], "new")


def test_ctrl_c_before_the_move_is_an_ordinary_interrupt_and_keeps_the_earlier_run(tmp_path):
    target = earlier_run(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt) as raised, staged_out_dir(target, overwrite=True):
        raise KeyboardInterrupt
    assert not isinstance(raised.value, InterruptedOnceWritten)
    assert (sorted(p.name for p in tmp_path.iterdir()), (target / "summary.json").read_text()) == (["run"], "earlier")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_compare_interrupted_on_a_stalled_stdout_says_its_outputs_are_complete_and_ends(tmp_path, signum, status):
    real, sim, out = gpu_run(tmp_path / "gpu"), sim_run(tmp_path / "sim"), tmp_path / "cmp"
    args = [sys.executable, "-m", "analysis.compare", str(real), str(sim), "--out", str(out), "--no-report"]
    code, stderr = signal_once_stdout_stalls(args, out, signum, REPO_ROOT, timeout_s=30)
    # Before: "interrupted: nothing written" over the folder, and no exit (killed after 30 s)
    assert (code, stderr) == (status, f"interrupted: the outputs in {out}/ are complete; only this summary was cut\n")
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.parquet"]
