"""Session 41 (A): a report's summary reads its token-gap percentiles from the gaps sorted by numpy (once, for the
summary and the CDF); the summary is the one written without a report, which partitions them unsorted."""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from analysis.runs import write_summary


def _requests() -> pl.DataFrame:
    rng = np.random.default_rng(41)
    rows = []
    for i in range(60):
        gaps = rng.lognormal(-3.5, 0.6, int(rng.integers(2, 300)))
        gaps[rng.random(gaps.size) < 0.3] = 0.025  # ties, as a decode step's time repeats
        times = np.cumsum(gaps) + i
        rows.append({"request_id": str(i), "replica": 0, "arrival_s": float(i), "first_scheduled_s": i + 0.01,
                     "first_token_s": float(times[0]), "finish_s": float(times[-1]), "prompt_tokens": 10,
                     "output_tokens": len(times), "cached_tokens": 0, "num_preemptions": 0,
                     "finish_reason": "length", "reject_reason": None, "token_times_s": times.tolist()})
    return pl.DataFrame(rows)


def test_summary_with_a_report_is_the_summary_without(tmp_path) -> None:
    requests = _requests()
    steps = pl.DataFrame({"replica": [0, 0, 0], "start_s": [0.0, 1.0, 2.0], "duration_s": [0.01, 0.02, 0.03],
                          "kv_usage": [0.1, 0.2, 0.3], "num_running": [1, 2, 1], "num_waiting": [0, 1, 0],
                          "num_prefill_tokens": [10, 0, 0], "num_decode_seqs": [0, 2, 1],
                          "num_batched_tokens": [10, 2, 1], "num_seqs": [1, 2, 1]})
    for name in ("report", "plain"):
        (tmp_path / name).mkdir()
    with_report = write_summary(tmp_path / "report", requests, steps, {}, report_title="t")
    without = write_summary(tmp_path / "plain", requests, steps, {})
    assert with_report == without
    assert with_report["itl_ms"]["p99"] is not None and with_report["p99_itl_ms"] is not None
    assert (tmp_path / "report" / "report.html").is_file() and not (tmp_path / "plain" / "report.html").exists()
    assert json.loads((tmp_path / "report" / "summary.json").read_text()) == json.loads(
        (tmp_path / "plain" / "summary.json").read_text())
