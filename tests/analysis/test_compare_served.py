"""A run served over HTTP (``traces.bench``) beside a simulation of the same trace in ``analysis.compare``:
the requests pair up, what a client cannot see is n/a, and the schedule diff says why it has none."""

from __future__ import annotations

import json

import polars as pl

from analysis.compare.cli import main as compare_main
from analysis.summarize import main as summarize_main
from cli.sim_replay import main as sim_main
from cli.traces_bench import main as bench_main
from tests.traces.fake_openai import FakeOpenAI
from traces.schema import save_trace


def test_served_run_beside_a_simulation(tmp_path, capsys) -> None:
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0, 0.2, 0.4],
                             "prompt_tokens": [16, 40, 24], "output_tokens": [4, 2, 6]}), trace)
    served, sim, out = tmp_path / "served", tmp_path / "sim", tmp_path / "cmp"
    with FakeOpenAI(ttft_s=0.02, itl_s=0.01) as server:  # reports, so both runs' report.html are built too
        assert bench_main([server.url, str(trace), "--model", "qwen3-0.6b", "--out", str(served), "--quiet",
                           "--slo", "ttft_p90=1s"]) == 0
    assert sim_main([str(trace), "--out", str(sim), "--quiet"]) == 0
    capsys.readouterr()
    assert compare_main([str(served), str(sim), "--out", str(out), "--schedule"]) == 0
    printed = capsys.readouterr().out
    assert "requests matched on request_id: 3 of 3 real" in printed
    assert "schedule diff: n/a (real (" in printed
    rows = {row.split("  ")[0]: row.split() for row in printed.splitlines()}
    assert rows["preemptions"][-4] == "n/a" and rows["preemptions"][-1] == "n/a"
    assert rows["engine steps"][-4] == "n/a"
    assert sorted(p.name for p in out.iterdir()) == ["compare.json", "compare.md", "compare.parquet", "report.html"]
    assert (served / "report.html").is_file()
    summary = json.loads((served / "summary.json").read_text())
    assert summary["request_goodput"] == summary["goodput"] > 0 and summary["slos_ms"] == {"ttft_p90": 1000.0}
    assert summarize_main([str(served), "--quiet"]) == 0  # a re-summary keeps the SLOs it was judged by
    assert json.loads((served / "summary.json").read_text())["goodput"] == summary["goodput"]
