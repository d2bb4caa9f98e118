"""validation/serving_probes.py: serving.py's GPU probes replayed in the simulator, side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "validation" / "serving_probes.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=600)


def _results(tmp_path: Path, probes: list[dict], trace: str = "traces/sharegpt.parquet") -> Path:
    """A serving.py result (a TTFT p90 limit of 100 ms): its 'now' probes on traces/sharegpt.parquet (a path relative
    to the repository, as serving.py records --trace), the first 300 requests."""
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({"trace": trace, "num_requests": 300, "ttft_p90_ms_limit": 100.0,
                                "runs": {"now": probes, "before": []}}))
    return path


def _probe(qps: float, ttft_p90_ms: float) -> dict:
    return {"qps": qps, "ttft_ms_p50": ttft_p90_ms / 2, "ttft_ms_p90": ttft_p90_ms, "tpot_ms_p50": 10.0,
            "output_throughput": 1000.0, "met_slo": ttft_p90_ms <= 100.0}


def test_probes_replayed_at_their_rates_with_verdicts_and_bands(tmp_path):
    # a light probe the simulator also passes, and one so far past capacity that it also misses
    results = _results(tmp_path, [_probe(2000.0, 5000.0), _probe(5.0, 50.0)])
    out = tmp_path / "table.json"
    done = _run(str(results), "--gpu", "h200", "--bands", "3", "--json", str(out))
    assert done.returncode == 0, done.stderr
    table = json.loads(out.read_text())
    assert [row["qps"] for row in table["probes"]] == [5.0, 2000.0]  # ascending, as printed
    assert [row["sim"]["met_slo"] for row in table["probes"]] == [True, False]
    assert table["verdicts_agree"] == 2 and table["gpu_met_qps"] == 5.0 and table["gpu_missed_qps"] == 2000.0
    assert 5.0 < table["sim_met_qps"] < table["sim_missed_qps"] < 2000.0
    assert table["num_requests"] == 300 and table["num_band_replays"] == 3
    for row in table["probes"]:
        assert set(row["bands"]) == {"ttft_ms_p50", "ttft_ms_p90", "tpot_ms_p50", "output_throughput"}
        for band in row["bands"].values():
            assert band["p5"] <= band["p95"]
    assert table["figures_banded"] == 8
    assert table["figures_inside_bands"] == sum(b["gpu_inside"] for r in table["probes"] for b in r["bands"].values())
    assert "| 5.0 |" in done.stdout and "verdicts agree on 2 of 2 probes" in done.stdout


@pytest.mark.parametrize("args, expected", [
    (["--engine", "after"], "--engine after"),
    (["--bands", "1"], "--bands"),
    (["--trace", "/nonexistent/t.parquet"], "--trace"),
])
def test_bad_input_gets_one_line(tmp_path, args, expected):
    done = _run(str(_results(tmp_path, [_probe(5.0, 50.0)])), "--gpu", "h200", *args)
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_not_serving_results_gets_one_line(tmp_path):
    no_rate = tmp_path / "r.json"
    no_rate.write_text(json.dumps({"runs": {"now": [{"qps": "5"}]}}))
    done = _run(str(no_rate), "--gpu", "h100")
    assert done.returncode == 2 and "runs.now[0]" in done.stderr and "Traceback" not in done.stderr
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    done = _run(str(bad), "--gpu", "h100")
    assert done.returncode == 2 and "serving.py's JSON" in done.stderr and "Traceback" not in done.stderr
    missing = _run(str(tmp_path / "none.json"), "--gpu", "h100")
    assert missing.returncode == 2 and "cannot read" in missing.stderr
