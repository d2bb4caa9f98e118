"""SLO syntax and the pass/fail and goodput rules of a capacity sweep (analysis.slo, analysis.capacity.slo_check)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.capacity.slo_check import check_slos
from analysis.metrics import goodput_rps, requests_meeting_slos
from analysis.slo import SLO, parse_slos, percentile
from tests.analysis.frames import requests_frame

# TTFT 0.5 / 1.0 / 2.0 s, TPOT 0.1 / 0.3 / - s, queue 0.1 / 0.5 / 1.0 s, then one rejected request.
ROWS = [
    dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.5, finish_s=0.7, output_tokens=3,
         token_times_s=[0.5, 0.6, 0.7]),
    dict(arrival_s=1.0, first_scheduled_s=1.5, first_token_s=2.0, finish_s=2.3, output_tokens=2,
         token_times_s=[2.0, 2.3]),
    dict(arrival_s=2.0, first_scheduled_s=3.0, first_token_s=4.0, finish_s=4.0, output_tokens=1,
         token_times_s=[4.0]),
]
REJECTED = dict(arrival_s=3.0, finish_s=3.0, finish_reason="rejected", reject_reason="too long")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ttft_p90=2s,tpot_p90=100ms", (SLO("ttft", "p90", 2.0), SLO("tpot", "p90", 0.1))),
        (" TTFT_P99 = 1.5S ", (SLO("ttft", "p99", 1.5),)),
        ("e2e_mean=10s,queue_p95=250ms", (SLO("e2e", "mean", 10.0), SLO("queue", "p95", 0.25))),
        ("itl_p50=1e2ms", (SLO("itl", "p50", 0.1),)),
    ],
)
def test_parse_good_slos(text: str, expected: tuple[SLO, ...]) -> None:
    assert parse_slos(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no SLO given"),
        ("ttft=2s", "cannot parse SLO 'ttft=2s'"),
        ("ttft_p90", "cannot parse SLO"),
        ("ttft_p90=-1s", "cannot parse SLO"),
        ("ttft_p90=2", "needs a unit; supported: ms, s"),
        ("ttft_p90=2h", "needs a unit; supported: ms, s"),
        ("foo_p90=1s", "unknown SLO metric 'foo'; supported: ttft, tpot, itl, e2e, queue"),
        ("ttft_p42=1s", "unknown SLO statistic 'p42'; supported: p50, p90, p95, p99, mean"),
        ("ttft_p90=0ms", "must be a finite number > 0"),
        ("ttft_p90=2s,ttft_p90=3s", "ttft_p90 is given twice"),
    ],
)
def test_parse_bad_slos(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_slos(text)


def test_slo_names_and_round_trip() -> None:
    slos = parse_slos("ttft_p90=2s,tpot_p90=100ms")
    assert [str(s) for s in slos] == ["ttft_p90=2s", "tpot_p90=100ms"]
    assert [s.key for s in slos] == ["ttft_p90", "tpot_p90"]
    assert slos[1].limit_ms == pytest.approx(100.0)
    assert parse_slos(",".join(str(s) for s in slos)) == slos


def test_percentile_treats_infinite_samples_as_unbounded() -> None:
    values = np.array([0.5, 1.0, 2.0, math.inf])
    assert percentile(values, 50) == 1.5
    assert percentile(values, 0) == 0.5
    assert percentile(np.array([0.5, 1.0, 2.0, 3.0, math.inf]), 75) == 3.0  # exactly on a finite sample
    assert percentile(values, 90) == math.inf
    finite = np.array([0.5, 1.0, 2.0])
    assert percentile(finite, 90) == pytest.approx(np.percentile(finite, 90))


def test_check_slos_on_finished_requests() -> None:
    requests = requests_frame(ROWS)
    check = check_slos(requests, parse_slos("ttft_p90=1.8s,tpot_p50=200ms,e2e_mean=2s,queue_p50=500ms,itl_p50=150ms"))
    assert check.values_ms == pytest.approx(
        {"ttft_p90": 1800.0, "tpot_p50": 200.0, "e2e_mean": 4000.0 / 3, "queue_p50": 500.0, "itl_p50": 100.0}
    )
    assert check.meets_slos  # every limit is inclusive
    assert not check_slos(requests, parse_slos("ttft_p90=1.7s")).meets_slos


def test_a_rejected_request_counts_as_infinitely_slow() -> None:
    requests = requests_frame(ROWS + [REJECTED])
    check = check_slos(requests, parse_slos("ttft_p50=1.6s,ttft_p90=100s,tpot_p90=100s,itl_p50=250ms"))
    assert check.values_ms == pytest.approx({"ttft_p50": 1500.0, "ttft_p90": None, "tpot_p90": None, "itl_p50": 200.0})
    assert not check.meets_slos  # ttft_p90 and tpot_p90 are unbounded
    assert check_slos(requests, parse_slos("ttft_p50=1.6s,itl_p50=250ms")).meets_slos
    assert not check_slos(requests, parse_slos("e2e_mean=1000s")).meets_slos  # any rejection fails a mean


def test_goodput_counts_requests_within_every_limit() -> None:
    requests = requests_frame(ROWS + [REJECTED])  # makespan: 0 s to 4 s
    assert requests_meeting_slos(requests, parse_slos("ttft_p90=1s")).to_list() == [True, True, False, False]
    assert goodput_rps(requests, parse_slos("ttft_p90=1s")) == 0.5
    assert goodput_rps(requests, parse_slos("ttft_p90=1s,tpot_p90=200ms")) == 0.25
    # A request's own ITL statistic; one token means no gaps, so no ITL violation.
    assert requests_meeting_slos(requests, parse_slos("itl_p50=150ms")).to_list() == [True, False, True, False]
    # Two SLOs on one metric: each request must meet the stricter limit.
    assert goodput_rps(requests, parse_slos("ttft_p50=2s,ttft_p99=600ms")) == 0.25
