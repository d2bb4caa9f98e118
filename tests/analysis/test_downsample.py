"""Plot reducers keep the points a reader looks for."""

from __future__ import annotations

import numpy as np

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
