"""Session 34 (helper B): the faster output path computes the same numbers as the code it replaced."""

from __future__ import annotations

import numpy as np
import polars as pl

from analysis.metrics import is_finished, itl_values, summarize
from analysis.report.downsample import _median_below, bucket_mean_max, cdf_points, histogram_edges
from analysis.report.replay_report import _replica_changes, _strictly_sorted, replica_series, replica_series_of
from analysis.stats import finite_values, latency_stats
from analysis.vllm_metrics import _stats_ms


def _bucket_mean_max_every_row(x: np.ndarray, y: np.ndarray, num_buckets: int) -> tuple[np.ndarray, ...]:
    """The sorted path as it was: every row's bucket computed, runs found where it changes."""
    x_min, x_max = float(np.min(x)), float(np.max(x))
    width = (x_max - x_min) / num_buckets or 1.0
    bucket = np.clip(((x - x_min) / width).astype(np.int64), 0, num_buckets - 1)
    centres = x_min + (np.arange(num_buckets) + 0.5) * width
    starts = np.concatenate(([0], np.flatnonzero(bucket[1:] != bucket[:-1]) + 1))
    counts = np.diff(np.append(starts, x.size))
    return centres[bucket[starts]], np.add.reduceat(y, starts) / counts, np.maximum.reduceat(y, starts)


def test_bucket_mean_max_bisected_runs_match_every_row() -> None:
    rng = np.random.default_rng(34)
    for size in (2, 3, 17, 401, 5_000):
        for x in (np.sort(rng.random(size) * 1_000), np.sort(rng.integers(0, 5, size).astype(float)),
                  np.cumsum(rng.exponential(1.0, size)) * 1e-3 + 1e6, np.full(size, 3.0)):
            for num_buckets in (1, 2, 7, 400):
                y = rng.random(size)
                for got, want in zip(bucket_mean_max(x, y, num_buckets), _bucket_mean_max_every_row(x, y, num_buckets)):
                    assert np.array_equal(got, want)


def test_bucket_mean_max_unsorted_and_gapped_inputs_unchanged() -> None:
    centres, means, maxes = bucket_mean_max(np.array([0.0, 1.0, 9.0, 10.0]), np.ones(4), num_buckets=5)
    assert centres.tolist() == [1.0, 9.0] and means.tolist() == [1.0, 1.0] and maxes.tolist() == [1.0, 1.0]
    x = np.array([5.0, 1.0, 3.0, 2.0])  # not ascending: the scattered path
    centres, means, maxes = bucket_mean_max(x, np.array([1.0, 2.0, 3.0, 4.0]), num_buckets=2)
    assert centres.tolist() == [2.0, 4.0] and means.tolist() == [3.0, 2.0] and maxes.tolist() == [4.0, 3.0]


def test_median_below_matches_numpy_median() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5_000):
        values = rng.integers(1, 6, int(rng.integers(1, 9))).astype(float) * rng.choice([0.1, 1.0])
        limit = float(rng.choice([0.1, 0.25, 1.0, 1.5, 2.0, 2.5, 3.0, 5.0, np.inf]))
        assert _median_below(values, limit) == bool(np.median(values) < limit)


def test_histogram_edges_log_bins_decided_as_before() -> None:
    skewed = np.concatenate([np.full(900, 64.0), np.full(100, 8_192.0)])  # most steps far below the largest
    edges, log_x = histogram_edges(skewed)
    assert log_x and edges[0] == 64.0 and edges[-1] == 8_192.0
    _, log_x = histogram_edges(np.concatenate([np.full(100, 64.0), np.full(900, 8_192.0)]))
    assert not log_x


def test_cdf_points_of_sorted_input_equal_a_sort() -> None:
    values = np.random.default_rng(3).exponential(size=50_000) + 1e-9
    for max_points in (100, 100_000):
        for got, want in zip(cdf_points(np.sort(values), max_points), cdf_points(values, max_points)):
            assert np.array_equal(got, want)
    with_zero = np.array([0.0, -0.0, 1.0])  # zeros: sorted as before
    assert cdf_points(with_zero, 10)[0].tolist() == np.sort(with_zero).tolist()


def test_strictly_sorted_matches_elementwise_rule() -> None:
    rng = np.random.default_rng(5)
    for _ in range(5_000):
        size = int(rng.integers(0, 8))
        replicas = rng.integers(0, 3, size)
        if rng.random() < 0.7:
            replicas = np.sort(replicas)
        x = rng.integers(0, 4, size).astype(float)
        if rng.random() < 0.5:
            x = np.sort(x)
        want = size < 2 or bool(np.all((replicas[1:] > replicas[:-1])
                                       | ((replicas[1:] == replicas[:-1]) & (x[1:] > x[:-1]))))
        assert _strictly_sorted(replicas, x, _replica_changes(replicas)) == want


def test_replica_series_views_hold_the_scaled_values() -> None:
    frame = pl.DataFrame({"replica": [0, 0, 1, 1], "start_s": [0.0, 1.0, 0.5, 2.0], "n": [1, 2, 3, 4]})
    series = replica_series(frame, "start_s", "n", 1.0)
    assert [s.name for s in series] == ["replica 0", "replica 1"]
    assert series[1].x.tolist() == [0.5, 2.0] and series[1].y.tolist() == [3.0, 4.0]
    assert series[0].y.dtype == np.float64
    assert replica_series(frame, "start_s", "n", 100.0)[0].y.tolist() == [100.0, 200.0]


def test_statistics_from_sorted_values_equal_unsorted() -> None:
    values = np.random.default_rng(11).exponential(0.03, 100_001)
    ordered = np.sort(values)
    assert latency_stats(values, ordered) == latency_stats(values)
    assert _stats_ms(values, ordered) == _stats_ms(values)
    assert _stats_ms(values[:-1], ordered[ordered != values[-1]]) == _stats_ms(values[:-1])  # an even count


def test_summarize_given_pooled_gaps_equals_summarize() -> None:
    rng = np.random.default_rng(2)
    rows = []
    for i in range(40):
        arrival = float(i)
        times = np.cumsum(rng.exponential(0.02, int(rng.integers(1, 30)))) + arrival + 0.1
        rows.append({"request_id": str(i), "replica": i % 2, "arrival_s": arrival, "first_scheduled_s": arrival + 0.05,
                     "first_token_s": float(times[0]), "finish_s": float(times[-1]), "prompt_tokens": 10,
                     "output_tokens": len(times), "cached_tokens": 0, "num_preemptions": 0,
                     "finish_reason": "length" if i % 7 else "abort", "reject_reason": None,
                     "token_times_s": times.tolist()})
    requests = pl.DataFrame(rows)
    steps = pl.DataFrame({"duration_s": [0.01, 0.02], "kv_usage": [0.1, 0.2]})
    itl_s = itl_values(requests.filter(is_finished()))
    shared = summarize(requests, steps, itl_s=itl_s, sorted_itl_s=np.sort(finite_values(itl_s)))
    assert shared == summarize(requests, steps)


def test_replica_series_of_equals_replica_series() -> None:
    sorted_log = pl.DataFrame({"replica": [0, 0, 0, 1, 1], "start_s": [0.0, 1.0, 2.0, 0.5, 0.7],
                               "n": [1, 2, 3, 4, 5], "with_null": [1.0, None, 3.0, 4.0, 5.0]})
    unsorted = sorted_log.reverse()
    null_x = sorted_log.with_columns(pl.when(pl.col("n") == 2).then(None).otherwise(pl.col("start_s")).alias("start_s"))
    for frame in (sorted_log, unsorted, null_x, sorted_log.head(0)):
        split = replica_series_of(frame, "start_s")
        for y, scale in (("n", 1.0), ("n", 100.0), ("with_null", 1.0)):
            got, want = split(y, scale), replica_series(frame, "start_s", y, scale)
            assert [s.name for s in got] == [s.name for s in want]
            for g, w in zip(got, want):
                assert np.array_equal(g.x, w.x) and np.array_equal(g.y, w.y)
