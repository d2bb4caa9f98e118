"""Exact metric values on small hand-made replays."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.metrics import add_latency_columns, goodput_rps, itl_values, requests_meeting_slos, summarize
from analysis.report.summary_table import format_field, format_summary_table, summary_table_html
from analysis.schema import REQUESTS_SCHEMA, STEPS_SCHEMA, empty_frame
from analysis.slo import parse_slos
from analysis.stats import latency_stats
from tests.analysis.frames import requests_frame, steps_frame, synthetic_requests, synthetic_steps

LATENCY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
NULL_STATS = {"p50": None, "p90": None, "p99": None, "mean": None}


@pytest.fixture
def replay() -> pl.DataFrame:
    """Two finished requests, one rejected and one aborted (see comments for expected values)."""
    return requests_frame(
        [
            # TTFT 0.5, E2E 1.5, TPOT (1.5-0.5)/2 = 0.5, queue 0.1, ITL [0.5, 0.5]
            dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.5, finish_s=1.5, output_tokens=3,
                 prompt_tokens=100, cached_tokens=50, num_preemptions=1, token_times_s=[0.5, 1.0, 1.5]),
            # TTFT 0.4, E2E 1.2, TPOT 0.8/3, queue 0.2, ITL [0.2, 0.4, 0.2]
            dict(arrival_s=1.0, first_scheduled_s=1.2, first_token_s=1.4, finish_s=2.2, output_tokens=4,
                 prompt_tokens=40, finish_reason="length", token_times_s=[1.4, 1.6, 2.0, 2.2]),
            # rejected: excluded from token totals and the prefix-cache hit rate
            dict(arrival_s=2.0, finish_s=2.0, prompt_tokens=1000, cached_tokens=500,
                 finish_reason="rejected", reject_reason="prompt_too_long"),
            # aborted at 3.0 after two tokens: E2E from its last token = 0.6, TPOT 0.2
            dict(arrival_s=0.5, first_scheduled_s=0.6, first_token_s=0.9, finish_s=3.0, output_tokens=2,
                 prompt_tokens=60, cached_tokens=10, finish_reason="aborted", token_times_s=[0.9, 1.1]),
        ]
    )


@pytest.fixture
def steps() -> pl.DataFrame:
    return steps_frame(
        [
            dict(replica=0, start_s=0.0, duration_s=1.0, kv_usage=0.2),
            dict(replica=0, start_s=1.0, duration_s=3.0, kv_usage=0.6),
            dict(replica=1, start_s=0.0, duration_s=0.0, kv_usage=1.0),
        ]
    )


def test_latency_columns(replay: pl.DataFrame) -> None:
    frame = add_latency_columns(replay)
    assert frame["ttft_s"].to_list()[2] is None
    assert frame["ttft_s"].to_list()[:2] == pytest.approx([0.5, 0.4])
    assert frame["ttft_s"][3] == pytest.approx(0.4)
    assert frame["e2e_s"][0] == pytest.approx(1.5)
    assert frame["e2e_s"][1] == pytest.approx(1.2)
    assert frame["e2e_s"][2] is None
    assert frame["e2e_s"][3] == pytest.approx(0.6)
    assert frame["tpot_s"][0] == pytest.approx(0.5)
    assert frame["tpot_s"][1] == pytest.approx(0.8 / 3)
    assert frame["tpot_s"][2] is None
    assert frame["tpot_s"][3] == pytest.approx(0.2)
    assert frame["queue_s"].to_list()[:2] == pytest.approx([0.1, 0.2])
    assert frame["queue_s"][2] is None
    assert frame.columns[: len(REQUESTS_SCHEMA)] == list(REQUESTS_SCHEMA)


def test_tpot_is_null_for_single_token_outputs() -> None:
    frame = add_latency_columns(
        requests_frame([dict(arrival_s=0.0, first_scheduled_s=0.0, first_token_s=0.3, finish_s=0.3,
                             output_tokens=1, token_times_s=[0.3])])
    )
    assert frame["tpot_s"][0] is None
    assert frame["e2e_s"][0] == pytest.approx(0.3)


def test_rejected_request_has_null_latencies_even_with_timestamps() -> None:
    frame = add_latency_columns(
        requests_frame([dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.2, finish_s=0.3,
                             finish_reason="rejected", reject_reason="x")])
    )
    assert frame.select("ttft_s", "tpot_s", "e2e_s", "queue_s").row(0) == (None, None, None, None)


def test_itl_values_pool_gaps_over_requests(replay: pl.DataFrame) -> None:
    assert np.sort(itl_values(replay)) == pytest.approx([0.2, 0.2, 0.2, 0.4, 0.5, 0.5])
    assert itl_values(replay.head(0)).size == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.one_of(st.floats(-1e6, 1e6), st.none()), max_size=5)), max_size=8),
       st.integers(0, 3))
def test_itl_values_pooled_in_one_pass_equal_the_per_list_gaps(token_times, num_chunks) -> None:
    """The one-pass pooling drops exactly the gaps that span two lists, whatever lists are null, empty or hold
    nulls, and however the column is chunked."""
    from analysis.metrics import _itl_values_per_list

    series = pl.Series("token_times_s", token_times, dtype=pl.List(pl.Float64))
    if num_chunks and len(token_times) > 1:  # a column made of several chunks (a concatenation) reads the same
        cut = len(token_times) // 2
        series = series[:cut].append(series[cut:])
    frame = pl.DataFrame({"token_times_s": series})
    expected = _itl_values_per_list(series)
    got = itl_values(frame)
    assert got.dtype == np.float64 and got.tolist() == expected.tolist()


def test_itl_values_of_a_sliced_frame_skip_the_rows_cut_off() -> None:
    frame = pl.DataFrame({"token_times_s": [[0.0, 1.0], [5.0, 5.5, 7.0], [9.0, 9.25]]})
    assert itl_values(frame.slice(1, 2)).tolist() == [0.5, 1.5, 0.25]


def test_latency_stats_match_numpy_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0, 10.0]
    stats = latency_stats(values)
    assert stats["p50"] == pytest.approx(3.0)
    assert stats["p90"] == pytest.approx(np.percentile(values, 90))  # 7.6
    assert stats["p90"] == pytest.approx(7.6)
    assert stats["p99"] == pytest.approx(9.76)
    assert stats["mean"] == pytest.approx(4.0)
    assert set(stats) == {"p50", "p90", "p99", "mean"}


def test_latency_stats_ignore_missing_and_handle_empty() -> None:
    assert latency_stats([1.0, None, 3.0, float("nan")])["p50"] == pytest.approx(2.0)
    assert latency_stats(pl.Series([None, 5.0]))["mean"] == pytest.approx(5.0)
    assert latency_stats([]) == NULL_STATS
    assert latency_stats(np.array([])) == NULL_STATS
    assert latency_stats(pl.Series([None, None], dtype=pl.Float64)) == NULL_STATS


def test_summary_values(replay: pl.DataFrame, steps: pl.DataFrame) -> None:
    summary = summarize(replay, steps)
    assert summary["num_requests"] == 4
    assert summary["num_finished"] == 2
    assert summary["num_rejected"] == 1
    assert summary["num_aborted"] == 1
    assert summary["reject_reasons"] == {"prompt_too_long": 1}
    assert summary["duration_s"] == pytest.approx(3.0)  # first arrival 0.0, aborted finish 3.0
    assert summary["request_throughput"] == pytest.approx(2 / 3, rel=1e-5)
    assert summary["total_output_tokens"] == 9
    assert summary["output_throughput"] == pytest.approx(7 / 3, rel=1e-5)  # vLLM's: finished requests' tokens
    assert summary["total_prompt_tokens"] == 200
    assert summary["prefix_cache_hit_rate"] == pytest.approx(60 / 200)
    assert summary["num_preemptions"] == 1
    assert summary["ttft_ms"] == pytest.approx({"p50": 450.0, "p90": 490.0, "p99": 499.0, "mean": 450.0})
    assert summary["tpot_ms"]["mean"] == pytest.approx((500.0 + 800 / 3) / 2, rel=1e-5)
    # finished requests' gaps: [500, 500, 200, 400, 200] ms
    assert summary["itl_ms"] == pytest.approx({"p50": 400.0, "p90": 500.0, "p99": 500.0, "mean": 360.0})
    assert summary["e2e_ms"] == pytest.approx({"p50": 1350.0, "p90": 1470.0, "p99": 1497.0, "mean": 1350.0})
    assert summary["queue_ms"] == pytest.approx({"p50": 150.0, "p90": 190.0, "p99": 199.0, "mean": 150.0})
    assert summary["peak_kv_usage"] == pytest.approx(1.0)
    assert summary["mean_kv_usage"] == pytest.approx((0.2 * 1.0 + 0.6 * 3.0) / 4.0)
    assert summary["num_steps"] == 3
    assert "goodput" not in summary and summary["request_goodput"] is None


def test_summary_carries_vllm_flat_names_computed_by_hand(replay: pl.DataFrame, steps: pl.DataFrame) -> None:
    """vLLM's calculate_metrics on the two finished requests: TTFT [500, 400] ms, TPOT [500, 800/3] ms, E2E
    [1500, 1200] ms, ITL pooled [500, 500, 200, 400, 200] ms; std is the population one (ddof=0)."""
    summary = summarize(replay, steps)
    expected = {
        "completed": 2, "failed": 2, "duration": 3.0, "total_input_tokens": 140,
        "request_throughput": 2 / 3, "output_throughput": 7 / 3, "total_token_throughput": 147 / 3,
        "mean_ttft_ms": 450.0, "median_ttft_ms": 450.0, "std_ttft_ms": 50.0, "p99_ttft_ms": 499.0,
        "mean_tpot_ms": (500 + 800 / 3) / 2, "median_tpot_ms": (500 + 800 / 3) / 2,
        "std_tpot_ms": (500 - 800 / 3) / 2, "p99_tpot_ms": 800 / 3 + 0.99 * (500 - 800 / 3),
        "mean_itl_ms": 360.0, "median_itl_ms": 400.0, "std_itl_ms": 18400 ** 0.5, "p99_itl_ms": 500.0,
        "mean_e2el_ms": 1350.0, "median_e2el_ms": 1350.0, "std_e2el_ms": 150.0, "p99_e2el_ms": 1497.0,
    }
    assert {key: summary[key] for key in expected} == pytest.approx(expected, rel=1e-5)
    with_slos = summarize(replay, steps, slos=parse_slos("ttft_p90=450ms"))  # only the 400 ms TTFT meets it
    assert with_slos["request_goodput"] == with_slos["goodput"] == pytest.approx(1 / 3, rel=1e-5)


def test_unknown_counts_are_missing_not_zero() -> None:
    """A run served over HTTP knows neither cached tokens, preemptions nor steps: null, not 0."""
    served = requests_frame([dict(arrival_s=0.0, first_token_s=0.5, finish_s=1.0, output_tokens=2, prompt_tokens=10,
                                  token_times_s=[0.5, 1.0])]).with_columns(
        pl.lit(None, pl.Int64).alias("cached_tokens"), pl.lit(None, pl.Int64).alias("num_preemptions"),
        pl.lit(None, pl.Float64).alias("first_scheduled_s"))
    summary = summarize(served, empty_frame(STEPS_SCHEMA))
    assert summary["total_cached_tokens"] is None and summary["prefix_cache_hit_rate"] is None
    assert summary["num_preemptions"] is None and summary["num_steps"] is None
    assert summary["queue_ms"] == NULL_STATS and summary["ttft_ms"]["p50"] == pytest.approx(500.0)
    assert "-" in format_summary_table(summary)
    assert summarize(served.head(0), empty_frame(STEPS_SCHEMA))["num_steps"] == 0  # nothing served: truly 0


def test_summary_is_plain_json(replay: pl.DataFrame, steps: pl.DataFrame) -> None:
    summary = summarize(replay, steps, slos=parse_slos("ttft_p90=1s"))
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary

    def check(value: object) -> None:
        if isinstance(value, (dict, list)):  # a list: metric_percentiles
            for item in value.values() if isinstance(value, dict) else value:
                check(item)
        else:
            assert value is None or type(value) in (int, float, str), value

    check(summary)


def test_summary_rounds_to_six_significant_digits(replay: pl.DataFrame, steps: pl.DataFrame) -> None:
    summary = summarize(replay, steps)
    assert summary["request_throughput"] == 0.666667
    assert summary["tpot_ms"]["p50"] == 383.333


def test_mean_kv_usage_falls_back_to_plain_mean_without_durations() -> None:
    summary = summarize(requests_frame([]), steps_frame([dict(kv_usage=0.2), dict(kv_usage=0.4)]))
    assert summary["mean_kv_usage"] == pytest.approx(0.3)


@pytest.mark.parametrize(
    "requests, steps",
    [
        (empty_frame(REQUESTS_SCHEMA), empty_frame(STEPS_SCHEMA)),
        (pl.DataFrame(), None),
    ],
)
def test_empty_summary(requests: pl.DataFrame, steps: pl.DataFrame | None) -> None:
    summary = summarize(requests, steps, slos=parse_slos("ttft_p90=1s"))
    assert summary["num_requests"] == 0
    assert summary["num_finished"] == 0
    assert summary["duration_s"] == 0.0
    assert summary["request_throughput"] is None
    assert summary["output_throughput"] is None
    for key in LATENCY_KEYS:
        assert summary[key] == NULL_STATS
    assert summary["prefix_cache_hit_rate"] is None  # no prompt token asked the cache
    assert summary["peak_kv_usage"] is None
    assert summary["mean_kv_usage"] is None
    assert summary["num_steps"] == 0
    assert summary["goodput"] is None  # no time passed: no rate, as request_throughput (was 0.0 beside its null)
    json.dumps(summary, allow_nan=False)
    assert "-" in format_summary_table(summary)


def test_all_rejected_summary() -> None:
    requests = requests_frame(
        [
            dict(arrival_s=0.0, finish_s=0.5, prompt_tokens=100, finish_reason="rejected", reject_reason="kv_full"),
            dict(arrival_s=1.0, finish_s=2.0, prompt_tokens=50, finish_reason="rejected", reject_reason="kv_full"),
        ]
    )
    summary = summarize(requests, empty_frame(STEPS_SCHEMA))
    assert summary["num_rejected"] == 2
    assert summary["num_finished"] == 0
    assert summary["duration_s"] == pytest.approx(2.0)
    assert summary["request_throughput"] == 0.0
    assert summary["output_throughput"] == 0.0
    assert summary["total_prompt_tokens"] == 0
    assert summary["prefix_cache_hit_rate"] is None  # was 0.0, read as a cache that missed every prompt
    assert format_field(summary, "prefix_cache_hit_rate") == "-"
    assert summary["reject_reasons"] == {"kv_full": 2}
    for key in LATENCY_KEYS:
        assert summary[key] == NULL_STATS
    assert goodput_rps(requests, parse_slos("ttft_p90=100s"), summary["duration_s"]) == 0.0


def test_meets_slos_and_goodput(replay: pl.DataFrame) -> None:
    # ttft 0.5 / 0.4, tpot 0.5 / 0.267, e2e 1.5 / 1.2 for the two finished requests
    assert requests_meeting_slos(replay, parse_slos("ttft_p90=0.45s")).to_list() == [False, True, False, False]
    # limit inclusive
    assert requests_meeting_slos(replay, parse_slos("ttft_p90=0.5s")).to_list() == [True, True, False, False]
    assert requests_meeting_slos(replay, parse_slos("tpot_p90=300ms")).to_list() == [False, True, False, False]
    both = parse_slos("e2e_p90=1.3s,ttft_p90=1s")
    assert requests_meeting_slos(replay, both).to_list() == [False, True, False, False]
    assert requests_meeting_slos(replay, ()).to_list() == [True, True, False, False]
    assert goodput_rps(replay, parse_slos("ttft_p90=0.45s"), duration_s=3.0) == pytest.approx(1 / 3)
    assert goodput_rps(replay, parse_slos("ttft_p90=10s"), duration_s=4.0) == pytest.approx(0.5)
    assert goodput_rps(replay, parse_slos("ttft_p90=10s"), duration_s=0.0) == 0.0
    assert summarize(replay, None, slos=parse_slos("ttft_p90=0.45s"))["goodput"] == pytest.approx(1 / 3, rel=1e-5)


def test_goodput_is_null_when_a_limited_metric_was_not_recorded() -> None:
    """A run served over HTTP (or imported) records no queue time: a queue SLO failed every request, and the goodput
    read as a measured 0.0 req/s. It cannot be judged; the SLOs on what was recorded still are."""
    served = requests_frame([
        dict(arrival_s=0.0, first_token_s=0.5, finish_s=1.5, output_tokens=3, token_times_s=[0.5, 1.0, 1.5],
             cached_tokens=None, num_preemptions=None),
        dict(arrival_s=1.0, first_token_s=1.2, finish_s=1.4, output_tokens=2, token_times_s=[1.2, 1.4],
             cached_tokens=None, num_preemptions=None),
    ])
    assert goodput_rps(served, parse_slos("queue_p90=10s,ttft_p90=10s")) is None
    summary = summarize(served, None, slos=parse_slos("queue_p90=10s"))
    assert summary["goodput"] is None and summary["request_goodput"] is None
    assert summary["slos_ms"] == {"queue_p90": 10000.0}
    assert goodput_rps(served, parse_slos("ttft_p90=0.45s,e2e_p90=10s")) == pytest.approx(1 / 1.5)
    # A rejected request has no queue time either, and is simply not good.
    rejected = requests_frame([dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.5, finish_s=1.0,
                                    output_tokens=1, token_times_s=[0.5]),
                               dict(arrival_s=0.5, finish_s=0.5, finish_reason="rejected")])
    assert goodput_rps(rejected, parse_slos("queue_p90=1s")) == pytest.approx(1.0)


def test_single_token_request_cannot_miss_a_tpot_slo() -> None:
    requests = requests_frame([dict(arrival_s=0.0, first_scheduled_s=0.0, first_token_s=0.1, finish_s=0.1,
                                    output_tokens=1, token_times_s=[0.1])])
    assert requests_meeting_slos(requests, parse_slos("tpot_p90=0.001s")).to_list() == [True]


def test_unknown_slo_is_an_error(replay: pl.DataFrame) -> None:
    with pytest.raises(ValueError, match="unknown SLO"):
        requests_meeting_slos(replay, parse_slos("latency_p90=1s"))


def test_missing_columns_are_reported() -> None:
    with pytest.raises(ValueError, match="first_token_s"):
        add_latency_columns(pl.DataFrame({"arrival_s": [0.0]}))


def test_format_summary_table(replay: pl.DataFrame, steps: pl.DataFrame) -> None:
    table = format_summary_table(summarize(replay, steps, slos=parse_slos("ttft_p90=0.45s")))
    lines = table.splitlines()
    assert "2 / 4" in lines[0]
    for label in ("rejected", "throughput", "goodput", "TTFT", "TPOT", "ITL", "E2E", "p99", "preemptions",
                  "prefix cache hit rate", "30.0 %", "KV usage"):
        assert label in table
    ttft_line = next(line for line in lines if line.strip().startswith("TTFT"))
    assert ttft_line.split()[1:] == ["450.00", "490.00", "499.00", "450.00"]
    assert format_summary_table({})  # missing keys render as "-"


def test_summarize_handles_a_large_replay() -> None:
    # Speed is a benchmark's business (benchmarks/sim_speed.py); this checks the vectorised paths at scale.
    requests = synthetic_requests(num_requests=20_000, mean_output_tokens=200)
    steps = synthetic_steps(num_steps=100_000)
    assert requests["output_tokens"].sum() > 3_500_000
    summary = summarize(requests, steps, slos=parse_slos("ttft_p90=0.5s,tpot_p90=0.04s"))
    assert summary["num_finished"] == 20_000
    assert summary["total_output_tokens"] == requests["output_tokens"].sum()
    assert 10.0 <= summary["itl_ms"]["mean"] <= 50.0


def test_summary_table_columns_stay_apart_for_huge_latencies() -> None:
    """Latencies of days filled the 10-character columns: '12540400000.0013878300000.00' read as one number."""
    summary = {"e2e_ms": {"p50": 12540400000.0, "p90": 999999.99, "p99": 1234567.891, "mean": 5.0}}
    row = next(line for line in format_summary_table(summary).splitlines() if line.strip().startswith("E2E"))
    assert row.split() == ["E2E", "1.254e+10", "999999.99", "1.235e+06", "5.00"]


def test_reject_reasons_that_differ_only_in_numbers_are_one_reason_with_a_range() -> None:
    """A trace of many over-long prompts summarised as one reason per request (561 on the Mooncake trace)."""
    from analysis.metrics import grouped_reasons

    counts = {"prompt has 41002 tokens, more than max_model_len=40960": 1,
              "prompt has 126195 tokens, more than max_model_len=40960": 2,
              "prompt has 40992 tokens, more than max_model_len=40960": 1,
              "prompt needs 9 KV blocks of 16 tokens, the cache has 8": 1,
              "empty prompt": 5, "kv_full": 2}
    assert list(grouped_reasons(counts).items()) == [
        ("empty prompt", 5), ("prompt has 40992 to 126195 tokens, more than max_model_len=40960", 4),
        ("kv_full", 2), ("prompt needs 9 KV blocks of 16 tokens, the cache has 8", 1)]
    # A limit that differs is a range too; the texts between numbers must match for reasons to merge.
    assert grouped_reasons({"a 1 of 5": 1, "a 2 of 6": 1, "b 1 of 5": 1}) == {"a 1 to 2 of 5 to 6": 2, "b 1 of 5": 1}
    # Numbers compare as numbers (9 < 10), of any length, without being parsed (int() refuses 5,000 digits).
    huge = "9" * 5000
    assert grouped_reasons({"x 10 y": 1, "x 9 y": 1, f"x {huge} y": 1}) == {f"x 9 to {huge} y": 3}
    assert grouped_reasons({}) == {}


def test_the_summary_and_its_table_name_the_grouped_rejection_reasons() -> None:
    reasons = ["prompt has 5000 tokens, more than max_model_len=4096",
               "prompt has 6000 tokens, more than max_model_len=4096", "empty prompt"]
    frame = requests_frame([{"arrival_s": float(i), "prompt_tokens": n, "output_tokens": 0,
                             "finish_reason": "rejected", "reject_reason": reason}
                            for i, (n, reason) in enumerate(zip([5000, 6000, 0], reasons))])
    summary = summarize(frame, empty_frame(STEPS_SCHEMA))
    assert summary["reject_reasons"] == {"prompt has 5000 to 6000 tokens, more than max_model_len=4096": 2,
                                         "empty prompt": 1}
    table = format_summary_table(summary).splitlines()
    assert table[2] == ("requests rejected       3 (prompt has 5000 to 6000 tokens, more than max_model_len=4096: 2; "
                        "empty prompt: 1)")
    many = {f"reason {letter}": 1 for letter in "abcde"}
    assert format_summary_table({**summary, "reject_reasons": many}).splitlines()[2].endswith(
        "(reason a: 1; reason b: 1; reason c: 1; 2 more reason(s) in summary.json)")
    html = summary_table_html(summary)
    assert ("<td>rejected</td><td>3 (prompt has 5000 to 6000 tokens, more than max_model_len=4096: 2; "
            "empty prompt: 1)</td>") in html
