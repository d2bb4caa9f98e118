"""analysis.summarize re-summarizes a replay folder without rewriting its tables or losing its metadata."""

from __future__ import annotations

import json

from analysis.summarize import main as summarize_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT


def test_resummarizing_keeps_tables_and_metadata(tmp_path):
    out = tmp_path / "run"
    assert replay_main([str(SHAREGPT), "--limit", "40", "--quiet", "--no-report", "--out", str(out)]) == 0
    tables = {name: (out / name).read_bytes() for name in ("requests.parquet", "steps.parquet")}
    before = json.loads((out / "summary.json").read_text())
    assert summarize_main([str(out), "--report", "--quiet"]) == 0
    after = json.loads((out / "summary.json").read_text())
    assert after == before  # config, cost_model and trace kept; the same metrics from the same tables
    assert {name: (out / name).read_bytes() for name in tables} == tables
    assert (out / "report.html").stat().st_size > 10_000
    assert not list(out.glob(".*partial"))
