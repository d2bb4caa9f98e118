"""Session 25, probe D: -o a link to nothing (dangling, or a symbolic link loop) was replaced by the trace without
--overwrite; a trace write that failed (a full disk) or was interrupted left the folders it made for -o, empty."""

from __future__ import annotations

import errno
import signal

import pyarrow.parquet as pq
import pytest

from tests.traces.helpers import cli_error
from traces.synth import main as synth_main

SYNTH = ["--num-requests", "5", "--qps", "1"]


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_link_to_nothing_is_not_replaced_without_overwrite(tmp_path, capsys, kind):
    link = tmp_path / "t.parquet"
    link.symlink_to(tmp_path / ("elsewhere.parquet" if kind == "dangling" else "t.parquet"))
    line = cli_error(synth_main, ["-o", str(link), *SYNTH], capsys)
    assert line == f"error: -o {link}: exists; pass --overwrite to replace it"
    assert link.is_symlink()
    assert synth_main(["-o", str(link), *SYNTH, "--overwrite"]) == 0  # asked for: replaced, not written through
    assert link.is_file() and not link.is_symlink()


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_takes_back_the_folders_it_made(tmp_path, capsys, monkeypatch, failure):
    def write_table(*args, **kwargs):
        raise failure

    monkeypatch.setattr(pq, "write_table", write_table)
    out = tmp_path / "new" / "deeper" / "t.parquet"
    if isinstance(failure, OSError):
        assert cli_error(synth_main, ["-o", str(out), *SYNTH], capsys) == f"error: -o {out}: No space left on device"
    else:
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            with pytest.raises(SystemExit) as stop:
                synth_main(["-o", str(out), *SYNTH])
        finally:  # an interrupted command leaves a further Ctrl-C to end the process at once: not pytest's
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
        assert stop.value.code == 130
    assert list(tmp_path.iterdir()) == []
