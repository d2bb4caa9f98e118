"""Plot reducers keep the points a reader looks for."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.report.downsample import cdf_points, minmax_indices, tail_preserving_sample


def test_minmax_keeps_spikes_and_order() -> None:
    x = np.arange(100_000, dtype=np.float64)
    y = np.zeros_like(x)
    y[12_345] = 99.0
    y[77_777] = -5.0
    keep = minmax_indices(x, y, num_buckets=500)
    assert len(keep) <= 1000
    assert 12_345 in keep and 77_777 in keep
    assert np.all(np.diff(keep) > 0)


def test_minmax_leaves_short_series_alone() -> None:
    assert minmax_indices(np.arange(10.0), np.arange(10.0), num_buckets=5).tolist() == list(range(10))


def test_cdf_points_exact_for_short_input() -> None:
    x, y = cdf_points(np.array([3.0, 1.0, 2.0, 4.0]), max_points=10)
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert y.tolist() == [0.25, 0.5, 0.75, 1.0]


def test_cdf_points_thinned_keep_extremes() -> None:
    values = np.random.default_rng(0).exponential(size=100_000)
    x, y = cdf_points(values, max_points=1000)
    assert len(x) <= 1000
    assert x[0] == values.min() and x[-1] == values.max()
    assert y[-1] == 1.0
    assert np.all(np.diff(x) >= 0)


def test_cdf_points_empty() -> None:
    x, y = cdf_points(np.array([]), max_points=10)
    assert x.size == 0 and y.size == 0


def test_tail_preserving_sample_keeps_largest() -> None:
    y = np.random.default_rng(1).uniform(size=50_000)
    keep = tail_preserving_sample(y, max_points=1000, tail_fraction=0.1)
    assert len(keep) == 1000
    assert np.all(np.diff(keep) > 0)
    largest = np.argsort(y)[-100:]
    assert set(largest) <= set(keep)


def test_bucket_mean_max_gives_the_level_and_the_spikes() -> None:
    from analysis.report.downsample import bucket_mean_max

    x = np.arange(1000.0)
    y = np.where(np.arange(1000) % 2 == 0, 0.0, 10.0)  # swings every step: a min/max envelope is a solid block
    y[503] = 100.0
    centres, means, maxes = bucket_mean_max(x, y, num_buckets=10)
    assert centres == pytest.approx([49.95 + 99.9 * i for i in range(10)])
    assert means == pytest.approx([5.0] * 5 + [5.9] + [5.0] * 4)
    assert maxes.tolist() == [10.0] * 5 + [100.0] + [10.0] * 4
    gaps, _, _ = bucket_mean_max(np.array([0.0, 1.0, 9.0, 10.0]), np.ones(4), num_buckets=5)
    assert gaps.tolist() == [1.0, 9.0]  # empty buckets are left out, not drawn as zero


def test_histogram_edges_fit_the_data() -> None:
    from analysis.report.downsample import histogram_edges

    edges, log_x = histogram_edges(np.array([1, 2, 2, 3, 8]))
    assert edges.tolist() == [0.5 + i for i in range(9)] and not log_x  # one bin per batch size
    # Decode steps of 1-64 tokens beside a few 8,192-token prefill steps: log bins, or one bar holds all.
    tokens = np.concatenate([np.arange(1, 65).repeat(50), np.full(20, 8192)])
    edges, log_x = histogram_edges(tokens, max_bins=60)
    assert log_x and len(edges) == 61 and edges[0] == 1 and edges[-1] == 8192
    counts, _ = np.histogram(tokens, bins=edges)
    assert (counts > 0).sum() >= 20
    edges, log_x = histogram_edges(np.linspace(0.0, 1.0, 10_000))
    assert not log_x and 10 <= len(edges) - 1 <= 60
    assert histogram_edges(np.array([3.0, 3.0]))[0].tolist() == [2.5, 3.5]
