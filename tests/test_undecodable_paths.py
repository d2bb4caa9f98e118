"""Paths holding a byte that is not UTF-8 (a Linux file name may be any bytes; Python gives it as a \\udcff escape).

polars and pyarrow take a path as UTF-8 text: such a trace could not be read, a run could not be written after the
whole simulation ("Object does not have a .write() method"), and a staging name raised UnicodeEncodeError. Every
reader and writer now goes through a handle Python opened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from analysis.compare.cli import main as compare_main
from cli.sim_replay import main as sim_main
from traces.info import main as info_main
from traces.synth import main as synth_main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def odd_dir(tmp_path) -> Path:
    folder = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/runs\xff"))
    try:
        folder.mkdir()
    except (OSError, UnicodeEncodeError):  # a file system that takes UTF-8 names only (macOS)
        pytest.skip("this file system refuses a name that is not UTF-8")
    return folder


def test_trace_runs_and_comparison_under_a_name_that_is_not_utf8(odd_dir, capsys) -> None:
    trace = odd_dir / "trace\udcff.parquet"
    assert synth_main(["-o", str(trace), "--num-requests", "12", "--qps", "4", "--seed", "3"]) == 0
    assert info_main([str(trace)]) == 0
    runs = []
    for qps in ("4", "8"):
        out = odd_dir / f"sim{qps}\udcff"
        assert sim_main([str(trace), "--qps", qps, "--out", str(out), "--quiet"]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["report.html", "requests.parquet", "steps.parquet",
                                                         "summary.json"]
        with open(out / "requests.parquet", "rb") as handle:
            assert pl.read_parquet(handle).height == 12
        runs.append(out)
    compared = odd_dir / "compare\udcff"
    assert compare_main([str(runs[0]), str(runs[1]), "--out", str(compared), "--no-report"]) == 0
    assert json.loads((compared / "compare.json").read_text())["metrics"]
    assert "\\udcff" in (compared / "compare.md").read_text(encoding="utf-8")  # the name, escaped
