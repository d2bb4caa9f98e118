"""Ctrl-C while a command's imports load (numpy, polars, torch: up to seconds), before its main runs: the command's
one line and status 130, where it was a KeyboardInterrupt traceback through importlib (status -2). An ordinary import
of the packages leaves the signals alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Runs the command as `python -m` does, with SIGINT sent to the process the moment numpy is first imported (every
# command's imports reach it, torch's and polars' included).
_INTERRUPT_AT_NUMPY = """
import os, runpy, signal, sys

class InterruptAtNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAtNumpy())
module, sys.argv = sys.argv[1], ["-m", *sys.argv[2:]]  # as python -m: '-m' while the packages on the way load
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("module", "args"), [
    ("engine.serve", ["--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--port", "0"]),
    ("engine.replay", ["traces/sharegpt.parquet", "--out", "OUT"]),
    ("traces.bench", ["http://127.0.0.1:9", "traces/sharegpt.parquet", "--out", "OUT"]),  # the package's own imports
    # commands whose main lives in their module: the traces and analysis packages quiet Ctrl-C until main starts
    ("traces.convert", ["vidur", "traces/README.md", "-o", "OUT"]),
    ("traces.synth", ["-o", "OUT", "--num-requests", "5", "--qps", "1"]),
    ("traces.info", ["traces/sharegpt.parquet"]),
    ("analysis.summarize", ["OUT"]),
    ("analysis.vllm_import", ["README.md", "--out", "OUT"]),
    # the main job, and the sim package's other commands (the package quiets Ctrl-C until main starts)
    ("sim.replay", ["traces/sharegpt.parquet", "--out", "OUT"]),
    ("sim.calibrate", ["OUT", "OUT"]),
])
def test_ctrl_c_while_importing_is_one_line(tmp_path, module, args):
    args = [str(tmp_path / "out") if arg == "OUT" else arg for arg in args]
    proc = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_NUMPY, module, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "interrupted: nothing written\n"), proc.stderr[-2000:]
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []


def test_importing_the_packages_leaves_ctrl_c_alone():
    code = ("import signal, traces, analysis, sim, traces.convert, analysis.summarize, sim.calibrate; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, "
            "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout == "True True\n", proc.stderr


# A command interrupted once, then again while exit handlers run (torch's and multiprocessing's, registered at import,
# run after main): the second Ctrl-C printed "Exception ignored in atexit callback" and a KeyboardInterrupt traceback.
_SECOND_CTRL_C_AT_EXIT = """
import atexit, os, signal, sys, time
from engine.core.interrupt import exit_130_on_interrupt

def slow_exit_handler():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)

atexit.register(slow_exit_handler)

@exit_130_on_interrupt()
def main():
    raise KeyboardInterrupt

sys.exit(main())
"""


def test_ctrl_c_again_while_exiting_is_still_one_line():
    proc = subprocess.run([sys.executable, "-c", _SECOND_CTRL_C_AT_EXIT], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "interrupted: nothing written\n"), proc.stderr[-2000:]
