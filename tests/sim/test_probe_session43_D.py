"""``--metric-percentiles`` (vLLM's option) on ``python -m sim.replay``: the chosen percentiles of the flat names in
summary.json, kept by ``analysis.summarize``; a bad value one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from analysis.summarize import main as summarize_main
from tests.sim.helpers import SHAREGPT, run_cli


def test_chosen_percentiles_are_written_and_kept_by_a_re_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli([SHAREGPT, "--limit", "40", "--qps", "20", "--metric-percentiles", "50,99.9", "--out", out,
                    "--no-report", "--quiet"])
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric_percentiles"] == [50.0, 99.9]
    assert {key for key in summary if key.startswith("p") and key.endswith("_ms")} == {
        f"p{q}_{metric}_ms" for q in ("50", "99.9") for metric in ("ttft", "tpot", "itl", "e2el")}
    assert summary["p50_ttft_ms"] == summary["median_ttft_ms"] == summary["ttft_ms"]["p50"]
    assert summary["max_concurrent_requests"] >= 1 and summary["max_output_tokens_per_s"] >= 1
    assert summarize_main([str(out), "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text()) == summary


def test_a_bad_percentile_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_cli([SHAREGPT, "--limit", "5", "--metric-percentiles", "50,101", "--out", out, "--quiet"])
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: --metric-percentiles: '101' is not a percentile; expected numbers from 0 to "
                                   "100, such as 25,50,99.9")
    assert not out.exists()
