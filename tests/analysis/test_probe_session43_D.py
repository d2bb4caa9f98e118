"""vLLM's serving-benchmark metrics that summaries lacked (forty-third session): peak concurrency and peak output
throughput as ``vllm bench serve`` computes them, and its ``--metric-percentiles`` choice of percentiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis.compare.error_table import run_metrics
from analysis.metrics import add_latency_columns, itl_values, summarize
from analysis.report.summary_table import format_summary_table
from analysis.runs import read_metric_percentiles
from analysis.stats import finite_values
from analysis.vllm_import import main as import_main
from analysis.vllm_metrics import (
    max_concurrent_requests,
    max_output_tokens_per_s,
    parse_metric_percentiles,
    percentile_name,
)
from tests.analysis.frames import requests_frame
from tests.analysis.test_vllm_import import vllm_result


@pytest.fixture
def replay() -> pl.DataFrame:
    """Two finished requests over [0, 1.5) and [1, 2.2), and an aborted one that neither figure counts."""
    return requests_frame([
        dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.5, finish_s=1.5, output_tokens=3,
             token_times_s=[0.5, 1.0, 1.5]),
        dict(arrival_s=1.0, first_scheduled_s=1.2, first_token_s=1.4, finish_s=2.2, output_tokens=4,
             finish_reason="length", token_times_s=[1.4, 1.6, 2.0, 2.2]),
        dict(arrival_s=0.5, first_scheduled_s=0.6, first_token_s=0.9, finish_s=3.0, output_tokens=2,
             finish_reason="aborted", token_times_s=[0.9, 1.1]),
    ])


def test_peak_concurrency_and_peak_output_throughput_count_finished_requests(replay: pl.DataFrame) -> None:
    """Second [1, 2) holds 1.0 and 1.5 (the first request's) and 1.4 and 1.6 (the second's): 4 tokens; the aborted
    request's 0.9 and 1.1 would have made it 5 and its interval 3 in flight at 1.0."""
    summary = summarize(replay, None)
    assert summary["max_concurrent_requests"] == 2
    assert summary["max_output_tokens_per_s"] == 4.0


def test_a_request_ending_as_another_arrives_is_not_counted_with_it() -> None:
    """vLLM's half-open intervals: [0, 1) and [1, 2) never overlap; [0.5, 1.5) overlaps each."""
    back_to_back = requests_frame([
        dict(arrival_s=0.0, first_token_s=0.5, finish_s=1.0, output_tokens=1, token_times_s=[0.5]),
        dict(arrival_s=1.0, first_token_s=1.5, finish_s=2.0, output_tokens=1, token_times_s=[1.5]),
    ])
    finished = add_latency_columns(back_to_back)
    assert max_concurrent_requests(finished) == 1
    overlapping = pl.concat([back_to_back, requests_frame([
        dict(arrival_s=0.5, first_token_s=0.7, finish_s=1.5, output_tokens=1, token_times_s=[0.7])])])
    assert max_concurrent_requests(add_latency_columns(overlapping)) == 2


def test_peak_figures_are_null_without_finished_requests(replay: pl.DataFrame) -> None:
    """A missing number must never read as a measured 0 (vLLM prints 0 there)."""
    nothing = add_latency_columns(replay).head(0)
    assert max_concurrent_requests(nothing) is None and max_output_tokens_per_s(nothing) is None
    aborted_only = summarize(replay.filter(pl.col("finish_reason") == "aborted"), None)
    assert aborted_only["max_concurrent_requests"] is None and aborted_only["max_output_tokens_per_s"] is None


def test_chosen_percentiles_replace_p99_in_the_flat_names(replay: pl.DataFrame) -> None:
    """TTFTs 500 and 400 ms: p50 450, p99.9 400 + 0.999 * 100; ITL gaps [500, 500, 200, 400, 200] ms: p50 400."""
    summary = summarize(replay, None, metric_percentiles=(50.0, 99.9))
    assert summary["metric_percentiles"] == [50.0, 99.9]
    assert summary["p50_ttft_ms"] == pytest.approx(450.0) and summary["p99.9_ttft_ms"] == pytest.approx(499.9)
    assert summary["p50_itl_ms"] == pytest.approx(400.0)
    assert summary["p50_e2el_ms"] == pytest.approx(1350.0) and summary["p99.9_e2el_ms"] == pytest.approx(1499.7)
    assert not any(key.startswith("p99_") for key in summary)
    assert summary["ttft_ms"]["p99"] == pytest.approx(499.0)  # our nested statistics keep their fixed percentiles
    assert summarize(replay, None)["metric_percentiles"] == [99.0]  # vLLM's default


def test_chosen_percentiles_read_from_sorted_gaps_are_the_same(replay: pl.DataFrame) -> None:
    """A report's run passes its sorted ITL gaps: the same percentiles, read by index instead of partitioned."""
    finished = add_latency_columns(replay).filter(pl.col("finish_reason").is_in(["stop", "length"]))
    itl_s = itl_values(finished)
    percentiles = (0.0, 12.5, 50.0, 99.9, 100.0)
    assert (summarize(replay, None, metric_percentiles=percentiles, itl_s=itl_s,
                      sorted_itl_s=np.sort(finite_values(itl_s)))
            == summarize(replay, None, metric_percentiles=percentiles))


@pytest.mark.parametrize(("q", "name"), [(99.0, "p99"), (99, "p99"), (99.9, "p99.9"), (0.0, "p0"), (12.5, "p12.5"),
                                          (100.0, "p100")])
def test_percentile_names_are_vllms(q: float, name: str) -> None:
    assert percentile_name(q) == name


def test_metric_percentiles_syntax() -> None:
    assert parse_metric_percentiles("25, 50,99.9") == (25.0, 50.0, 99.9)
    assert parse_metric_percentiles("99,99.0") == (99.0,)
    for bad in ("", "abc", "101", "-1", "nan", "50,,90"):
        with pytest.raises(ValueError, match="is not a percentile; expected numbers from 0 to 100"):
            parse_metric_percentiles(bad)


def test_summary_table_prints_vllms_throughput_and_peak_lines(replay: pl.DataFrame) -> None:
    """Duration 3.0 s (first arrival to last finish): 7 finished output and 20 prompt tokens."""
    lines = format_summary_table(summarize(replay, None)).splitlines()
    assert "total token throughput  9.0 tok/s" in lines
    assert "peak output throughput  4 tok/s" in lines
    assert "max concurrent requests 2" in lines


def test_comparison_has_the_peak_figures(replay: pl.DataFrame) -> None:
    _, flat = run_metrics(replay, pl.DataFrame())
    assert (flat["max_concurrent_requests"], flat["max_output_tokens_per_s"]) == (2, 4.0)
    assert flat["total_token_throughput"] == pytest.approx(9.0)


def test_imported_vllm_result_gets_vllms_peak_figures(tmp_path: Path) -> None:
    """The file's successful requests span [100, 100.08), [100.5, 100.53) and [101.2, 101.27): never two at once;
    their tokens at 100.05-100.08 and 100.56-100.59 fall in second 0 (7), 101.24 and 101.27 in second 1."""
    path = tmp_path / "result.json"
    path.write_text(json.dumps(vllm_result()))
    out = tmp_path / "run"
    assert import_main([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["max_concurrent_requests"], summary["max_output_tokens_per_s"]) == (1, 7.0)


def test_recorded_percentiles_are_checked(tmp_path: Path) -> None:
    assert read_metric_percentiles(tmp_path) == (99.0,)  # no summary.json: vLLM's default
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"metric_percentiles": [50, 99.9, 50.0]}))
    assert read_metric_percentiles(tmp_path) == (50.0, 99.9)
    for bad, problem in (("90", "expected a list of percentiles"), (["90"], "expected a list of percentiles"),
                         ([101], "101 is not a percentile"), ([True], "expected a list of percentiles")):
        summary.write_text(json.dumps({"metric_percentiles": bad}))
        with pytest.raises(ValueError, match=f"^{summary}: metric_percentiles.*{problem}"):
            read_metric_percentiles(tmp_path)


def test_peak_output_throughput_of_a_run_spanning_far_more_seconds_than_tokens() -> None:
    """Tokens at 0.5, 1e11 and 1e11 + 0.5 s: two in one second, counted without a counter for each of 1e11 seconds."""
    spread = requests_frame([
        dict(arrival_s=0.0, first_token_s=0.5, finish_s=0.5, output_tokens=1, token_times_s=[0.5]),
        dict(arrival_s=1e11, first_token_s=1e11, finish_s=1e11 + 0.5, output_tokens=2,
             token_times_s=[1e11, 1e11 + 0.5]),
    ])
    assert max_output_tokens_per_s(add_latency_columns(spread)) == 2.0
