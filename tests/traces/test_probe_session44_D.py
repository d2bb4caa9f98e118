"""Session 44 (helper D): a trace behind a symbolic link loop was refused as "no such file", which sent the user
looking for a file that is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.traces.helpers import link_loop
from traces.schema import TraceError, load_trace


def test_a_trace_behind_a_link_loop_is_named_so(tmp_path: Path) -> None:
    loop = link_loop(tmp_path, "trace.parquet", "other.parquet")
    with pytest.raises(TraceError) as refused:
        load_trace(loop)
    assert str(refused.value) == f"{loop}: cannot read the trace: a symbolic link loop"


def test_a_missing_trace_is_still_no_such_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as refused:
        load_trace(tmp_path / "absent.parquet")
    assert str(refused.value) == f"{tmp_path / 'absent.parquet'}: cannot read the trace: no such file"
