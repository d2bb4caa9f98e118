"""Session 47 (C): sim.files.write_bytes_atomic (reports, profiles, every JSON a tool writes) left the hidden staging
file of a writer killed by SIGKILL (the out-of-memory killer, `timeout -s KILL`) beside its target for good: the
folder writers (traces.schema, analysis.outdir) swept theirs, this one did not."""

from __future__ import annotations

import subprocess
import sys

from sim.files import write_text_atomic
from traces.files import staging_path


def _dead_pid() -> int:
    """The id of a process that ran and is gone (reaped: a zombie still holds its id)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_file_write_removes_the_staging_file_of_a_dead_writer(tmp_path, capsys) -> None:
    out = tmp_path / "summary.json"
    dead_pid = _dead_pid()
    dead, running = staging_path(out, "partial", dead_pid), staging_path(out, "partial", 1)  # pid 1 always runs
    other = staging_path(tmp_path / "other.json", "partial", dead_pid)  # another target's: not this writer's to sweep
    for left in (dead, running, other):
        left.write_bytes(b'{"half": ')
    write_text_atomic(out, "{}\n")
    assert out.read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name, out.name])
    assert capsys.readouterr().err == (f"note: removed {dead}, left by a writer (pid {dead_pid}) that was killed "
                                       "before it finished\n")
