"""Hostile numbers probe (session 22, H): figures recomputed by hand from a run's own tables disagreed with the
tools' verdicts at the edges: a percentile computed two ways, and an SLO limit that depended on its unit."""

from __future__ import annotations

import json

import numpy as np

from analysis.capacity.slo_check import check_slos
from analysis.metrics import requests_meeting_slos, summarize
from analysis.runs import read_slos
from analysis.slo import parse_slos, percentile
from tests.analysis.frames import requests_frame


def _timed(ttfts_s: list[float], arrival_s: float = 0.0):
    """Finished one-token requests arriving at ``arrival_s`` with these TTFTs."""
    return requests_frame([
        {"arrival_s": arrival_s, "first_scheduled_s": arrival_s, "first_token_s": arrival_s + ttft,
         "finish_s": arrival_s + ttft, "output_tokens": 1, "token_times_s": [arrival_s + ttft]}
        for ttft in ttfts_s
    ])


def test_capacity_p90_exactly_at_the_limit_is_the_summarys_p90() -> None:
    """Six TTFTs whose p90 (numpy's linear interpolation, as summary.json takes it) is exactly 300 ms: summary.json
    said TTFT p90 300 ms, and the capacity check of ttft_p90=300ms said it missed (its own interpolation gave
    0.30000000000000004 s and the point's slo_values_ms printed 300 beside "missed")."""
    requests = _timed([0.0, 0.0, 0.0, 0.0, 0.095, 0.505])
    assert summarize(requests, None)["ttft_ms"]["p90"] == 300.0
    check = check_slos(requests, parse_slos("ttft_p90=300ms"))
    assert check.meets_slos is True
    assert check.values_ms == {"ttft_p90": 300.0}


def test_slo_percentile_is_numpys_bit_for_bit() -> None:
    rng = np.random.default_rng(22)
    for _ in range(2000):
        values = np.sort(rng.random(int(rng.integers(1, 40))) * 3)
        for q in (50.0, 90.0, 95.0, 99.0):
            assert percentile(values, q) == float(np.percentile(values, q))
    # +inf samples (unfinished requests): inf once one is weighted, numpy's value while none is
    assert percentile(np.array([0.1, 0.2, np.inf]), 50.0) == 0.2
    assert percentile(np.array([0.1, 0.2, np.inf]), 90.0) == np.inf
    assert percentile(np.array([0.1, 0.2, 0.3, np.inf]), 50.0) == float(np.percentile([0.1, 0.2, 0.3], 75.0))


def test_a_limit_in_ms_is_the_same_limit_in_s() -> None:
    """ttft_p90=700ms parsed to 0.7000000000000001 s (700 * 1e-3), ttft_p90=0.7s to 0.7: a request with a TTFT of
    0.8 - 0.1 = 0.7000000000000001 s met the SLO written in ms and missed it written in s, in goodput and in the
    capacity verdict alike."""
    assert parse_slos("ttft_p90=700ms") == parse_slos("ttft_p90=0.7s")
    requests = requests_frame([{"arrival_s": 0.1, "first_scheduled_s": 0.1, "first_token_s": 0.8, "finish_s": 0.8,
                                "output_tokens": 1, "token_times_s": [0.8]}])
    assert requests_meeting_slos(requests, ()).to_list() == [True]
    in_ms, in_s = parse_slos("ttft_p90=700ms"), parse_slos("ttft_p90=0.7s")
    assert requests_meeting_slos(requests, in_ms).to_list() == requests_meeting_slos(requests, in_s).to_list() == [
        False]
    assert check_slos(requests, in_ms).meets_slos is check_slos(requests, in_s).meets_slos is False


def test_slos_ms_read_back_are_the_limits_given(tmp_path) -> None:
    """summary.json's slos_ms of ttft_p90=2.1ms was 2.1000000000000005 (0.0021 * 1e3), and analysis.summarize read
    it back as 2.1000000000000005 / 1e3, another limit than 2.1ms: a re-summary could change the run's goodput."""
    slos = parse_slos("ttft_p90=2.1ms,tpot_p90=700ms,e2e_p50=2s")
    summary = summarize(_timed([0.001]), None, slos)
    assert summary["slos_ms"] == {"ttft_p90": 2.1, "tpot_p90": 700.0, "e2e_p50": 2000.0}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert read_slos(tmp_path) == slos


def test_capacity_parquet_keeps_the_verdicts_slo_statistic(tmp_path) -> None:
    """With prompts beyond --max-model-len rejected, a point's TTFT p90 SLO statistic (every measured request, a
    rejected one infinitely slow: capacity.json's slo_values_ms) is above its finished requests' p90 (latency_ms);
    capacity.parquet wrote both as ttft_p90_ms, the second overwriting the first, so its rows showed another figure
    than the one the verdict judged."""
    import polars as pl

    from analysis.capacity.cli import main as capacity_main
    from tests.sim.helpers import SHAREGPT

    out = tmp_path / "cap"
    assert capacity_main([str(SHAREGPT), "--limit", "300", "--max-model-len", "6000", "--slo", "ttft_p90=300ms",
                          "--min-duration-s", "30", "--min-requests", "300", "--jobs", "1", "--qps-min", "10",
                          "--qps-max", "20", "--no-duration-check", "--quiet", "--out", str(out)]) == 0
    points = json.loads((out / "capacity.json").read_text())[0]["searches"][0]["points"]
    frame = pl.read_parquet(out / "capacity.parquet")
    assert frame["qps"].to_list() == [p["qps"] for p in points]
    assert all(p["num_rejected"] > 0 for p in points)
    assert frame["slo_ttft_p90_ms"].to_list() == [p["slo_values_ms"]["ttft_p90"] for p in points]
    assert frame["ttft_p90_ms"].to_list() == [p["latency_ms"]["ttft_ms"]["p90"] for p in points]
    assert all(p["slo_values_ms"]["ttft_p90"] > p["latency_ms"]["ttft_ms"]["p90"] for p in points)
