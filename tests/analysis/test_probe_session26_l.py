"""Probe L (session 26): silent wrong numbers in analysis.compare, checked against hand computations.

What the probe found:

- The per-request errors (compare.json ``requests.relative_errors``, the printed "per-request rel. error" table and
  the report's scatter) paired every matched request, finished or not, while the error table's latencies time
  finished requests only. An aborted or failed request's E2E is its last token's time, so beside the other run's
  whole answer it read as a simulator error: a GPU run of 200 ShareGPT requests with 40 aborted after 3 tokens showed
  a per-request E2E p90 of +2860 % and mean |err| of 755 % over "200 pairs". Now a pair's errors are null unless the
  request finished in both runs: here the E2E errors are those of the two finished pairs, exactly.
- The schedule diff's first differing request was the earliest by arrival taken from whichever side had the row, each
  on its own clock: a GPU run whose clock starts at 1000 s beside a simulation of more requests named a sim-only
  request first ("request_id '150' exists only in sim", 20 s into the run) before one that differed 0.3 s into it.
  Now arrivals count from each run's first one: the first difference is the request that differs earliest.
"""

from __future__ import annotations

import polars as pl
import pytest

from analysis.compare.request_join import join_requests
from analysis.compare.step_diff import compare_schedules
from tests.analysis.frames import requests_frame, steps_frame


def _request(index: int, ttft_s: float, gap_s: float, num_tokens: int, origin_s: float = 0.0,
             finish_reason: str = "length", **extra) -> dict:
    arrival_s = origin_s + float(index)
    times = [arrival_s + ttft_s + gap_s * k for k in range(num_tokens)]
    return dict(request_id=f"r{index}", arrival_s=arrival_s, first_scheduled_s=arrival_s, first_token_s=times[0],
                finish_s=times[-1], output_tokens=num_tokens, prompt_tokens=100, token_times_s=times,
                finish_reason=finish_reason, **extra)


def test_per_request_errors_pair_only_requests_finished_on_both_sides() -> None:
    # r0, r1 finished on both sides: sim TTFT +10 % and the same gaps. r2 was aborted on the GPU after 3 of its 101
    # tokens (its E2E there: 0.1 + 2 * 0.01 = 0.12 s), and finished in the simulation (0.11 + 100 * 0.01 = 1.11 s).
    real = requests_frame([_request(0, 0.1, 0.01, 101), _request(1, 0.2, 0.01, 101),
                           _request(2, 0.1, 0.01, 3, finish_reason="aborted")])
    sim = requests_frame([_request(0, 0.11, 0.01, 101), _request(1, 0.22, 0.01, 101), _request(2, 0.11, 0.01, 101)])
    join = join_requests(real, sim)
    assert join.num_matched == 3  # still matched, and still in compare.parquet with both sides' columns
    aborted = join.frame.filter(pl.col("request_id") == "r2")
    assert aborted["e2e_s_real"].item() == pytest.approx(0.12) and aborted["e2e_s_sim"].item() == pytest.approx(1.11)
    # ...but not timed: the E2E error of r2 was (1.11 - 0.12) / 0.12 = +825 %.
    assert aborted.select("ttft_rel_error", "tpot_rel_error", "e2e_rel_error").row(0) == (None, None, None)
    stats = join.error_stats()
    assert stats["e2e"]["num_pairs"] == stats["ttft"]["num_pairs"] == 2
    # E2E of r0: 1.1 -> 1.11 s (+0.909 %); r1: 1.2 -> 1.22 s (+1.667 %).
    expected = sorted([0.01 / 1.1, 0.02 / 1.2])
    assert stats["e2e"]["p10"] == pytest.approx(expected[0] + 0.1 * (expected[1] - expected[0]), rel=1e-5)
    assert stats["e2e"]["mean"] == pytest.approx(sum(expected) / 2, rel=1e-5)
    assert stats["ttft"]["mean"] == stats["ttft"]["p50"] == pytest.approx(0.1, rel=1e-5)


def test_failed_or_rejected_on_one_side_has_no_per_request_error() -> None:
    # r1 failed on the GPU after 5 of its 50 tokens (an HTTP client's timeout) and finished in the simulation; r2 was
    # rejected by the simulation. Only r0 (finished on both, TTFT 0.1 -> 0.2 s) is timed.
    real = requests_frame([_request(0, 0.1, 0.01, 5), _request(1, 0.1, 0.01, 5, finish_reason="error"),
                           _request(2, 0.1, 0.01, 5)])
    sim = requests_frame([_request(0, 0.2, 0.01, 5), _request(1, 0.1, 0.01, 50),
                          dict(request_id="r2", arrival_s=2.0, finish_reason="rejected", prompt_tokens=100)])
    stats = join_requests(real, sim).error_stats()
    assert {key: entry["num_pairs"] for key, entry in stats.items()} == {"ttft": 1, "tpot": 1, "e2e": 1}
    assert stats["ttft"]["mean"] == pytest.approx(1.0)
    assert stats["e2e"]["mean"] == pytest.approx(0.1 / 0.14)  # r0's E2E 0.14 -> 0.24 s; r1's +350 % is not in it


def test_schedule_diff_first_request_counts_arrivals_from_each_runs_own_start() -> None:
    # The GPU run's clock starts at 1000 s; the simulation replayed one request more (r3, 3 s in) and r1 (1 s in)
    # was cached differently. The first difference is r1, not the sim-only r3 (3 s < 1001 s on the raw clocks).
    real = requests_frame([_request(i, 0.1, 0.01, 3, origin_s=1000.0, cached_tokens=16 if i == 1 else 0)
                           for i in range(3)])
    sim = requests_frame([_request(i, 0.1, 0.01, 3) for i in range(4)])
    steps = steps_frame([dict(num_seqs=1)])
    diff = compare_schedules(steps, steps, real, sim)
    assert diff.requests.num_differing == 2
    first = diff.requests.first_difference
    assert first.key == {"request_id": "r1"} and first.columns == ("cached_tokens",) and first.missing_in is None
    # One side alone, the raw arrivals order it as before (nothing to mix).
    diff = compare_schedules(steps, steps, sim.head(3), sim)
    assert diff.requests.first_difference.key == {"request_id": "r3"}
    assert diff.requests.first_difference.missing_in == "real"
