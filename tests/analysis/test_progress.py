"""A signal that lands while a progress bar is first drawn (inside tqdm's constructor): the bar is closed all the same
and the interrupt's line starts a line of its own. The signal tests, which signal a command once its bar shows, met
"bands:   0%| ... |interrupted: nothing written to ..." now and then on a loaded machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.progress import progress_bar
from tests.sim.helpers import SHAREGPT

REPO = Path(__file__).resolve().parents[2]

# sim.replay run as python -m runs it, with the signal sent to itself right after the band bar's first draw, inside
# tqdm's constructor: where a signal to the process group lands when the command is descheduled just after the draw.
_SIGNAL_AT_THE_FIRST_DRAW = """
import os, runpy, signal, sys
import tqdm.std

SIGNUM = getattr(signal, sys.argv[1])
draw = tqdm.std.tqdm.refresh

def draw_then_signal(self, *args, **kwargs):
    drawn = draw(self, *args, **kwargs)
    if self.desc == "bands" and not hasattr(self, "start_t"):  # start_t: set once the constructor has drawn
        os.kill(os.getpid(), SIGNUM)
    return drawn

tqdm.std.tqdm.refresh = draw_then_signal
sys.argv = ["-m", *sys.argv[2:]]
runpy.run_module("sim.replay", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_the_bar_is_first_drawn_is_acted_on_once_the_bar_is_closed(monkeypatch, capsys):
    import tqdm.std

    draw = tqdm.std.tqdm.refresh

    def draw_then_ctrl_c(self, *args, **kwargs):
        drawn = draw(self, *args, **kwargs)
        if not hasattr(self, "start_t"):  # the draw inside the constructor
            os.kill(os.getpid(), signal.SIGINT)
        return drawn

    monkeypatch.setattr(tqdm.std.tqdm, "refresh", draw_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt), progress_bar(False, total=3, desc="bands", bar_format="{desc}: {n}/{total}"):
        pytest.fail("the block ran after the Ctrl-C")
    # drawn, then closed (drawn again, and the line ended)
    assert capsys.readouterr().err == "\rbands: 0/3\rbands: 0/3\n"


def test_a_quiet_command_has_no_bar(capsys):
    with progress_bar(True, total=3, desc="bands") as bar:
        assert bar is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("signame", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_at_the_band_bars_first_draw_is_one_line_of_its_own(tmp_path, signame, status):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AT_THE_FIRST_DRAW, signame, str(SHAREGPT), "--limit", "50",
                           "--out", str(out), "--no-report", "--bands", "2"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == status
    assert proc.stderr.endswith(f"replay/s]\ninterrupted: nothing written to {out}\n"), proc.stderr[-500:]
    assert "Traceback" not in proc.stderr
    assert not out.exists()
