"""Point reduction for plots, so HTML reports stay small without hiding outliers.

A 100k-step run or 4M inter-token gaps would make a page of hundreds of MB;
each reducer here keeps the points a reader looks for (spikes, tails, min/max).
"""

from __future__ import annotations

import numpy as np


def minmax_indices(x: np.ndarray, y: np.ndarray, num_buckets: int) -> np.ndarray:
    """Indices of the min and max `y` in each of `num_buckets` equal-width `x` buckets.

    Drawn as a line, the kept points trace the same envelope as the full series,
    so short spikes (a burst of waiting requests, a KV-usage peak) stay visible.
    Returned indices are ascending, so an `x`-sorted input stays sorted.
    """
    num_points = len(x)
    if num_points <= 2 * num_buckets:
        return np.arange(num_points)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x_min, x_max = float(np.nanmin(x)), float(np.nanmax(x))
    width = (x_max - x_min) / num_buckets or 1.0
    bucket = np.clip(((x - x_min) / width).astype(np.int64), 0, num_buckets - 1)
    order = np.lexsort((y, bucket))
    sorted_bucket = bucket[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_bucket[1:] != sorted_bucket[:-1])))
    ends = np.append(starts[1:], num_points) - 1
    return np.unique(np.concatenate([order[starts], order[ends]]))


def cdf_points(values: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF as (sorted values, cumulative fraction), at most `max_points` long.

    Long inputs are thinned to evenly spaced ranks, always keeping the minimum
    and the maximum so the tail of the distribution is drawn exactly.
    """
    values = np.asarray(values, dtype=np.float64)
    # Already ascending (a summary's sorted token gaps, 4.6M on the Azure trace's hour): sorting them again costs as
    # much as on any order. All positive, so no -0.0 beside a 0.0 that a sort might put in another order.
    ascending = values.size > 1 and values[0] > 0 and bool(np.all(values[1:] >= values[:-1]))
    ordered = values if ascending else np.sort(values)
    num_values = ordered.size
    if num_values == 0:
        return ordered, ordered.copy()
    if num_values <= max_points:
        ranks = np.arange(num_values)
    else:
        ranks = np.unique(np.linspace(0, num_values - 1, max_points).round().astype(np.int64))
    return ordered[ranks], (ranks + 1) / num_values


def tail_preserving_sample(y: np.ndarray, max_points: int, tail_fraction: float = 0.1) -> np.ndarray:
    """Ascending indices of at most `max_points` points: the largest `y` plus a uniform sample.

    For scatter plots of per-request latency, where the slowest requests are the
    interesting ones and a purely random sample would drop most of them.
    """
    num_points = len(y)
    if num_points <= max_points:
        return np.arange(num_points)
    values = np.nan_to_num(np.asarray(y, dtype=np.float64), nan=-np.inf)
    num_tail = max(1, int(max_points * tail_fraction))
    tail = np.argpartition(values, num_points - num_tail)[num_points - num_tail:]
    rest = np.setdiff1d(np.arange(num_points), tail, assume_unique=True)
    sample = np.random.default_rng(0).choice(rest, size=max_points - num_tail, replace=False)
    return np.sort(np.concatenate([tail, sample]))


def bucket_mean_max(x: np.ndarray, y: np.ndarray, num_buckets: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bucket centres, mean y, max y) over `num_buckets` equal-width `x` buckets, empty buckets left out.

    A min/max envelope of a series that swings every step (waiting sequences, step durations) fills
    its whole range and draws a solid block; the mean shows the level and the max the spikes.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size == 0:
        return x, y, y
    if x.size > 1 and np.isfinite(x[0]) and np.isfinite(x[-1]) and bool(np.all(x[1:] >= x[:-1])):
        return _sorted_bucket_mean_max(x, y, num_buckets)
    x_min, x_max = float(np.min(x)), float(np.max(x))
    width = (x_max - x_min) / num_buckets or 1.0
    bucket = np.clip(((x - x_min) / width).astype(np.int64), 0, num_buckets - 1)
    centres = x_min + (np.arange(num_buckets) + 0.5) * width
    if x.size > 1 and not np.any(bucket[1:] < bucket[:-1]):
        # Buckets in order: each bucket is one run of rows, reduced in place; the scattered path below
        # (np.maximum.at) took most of a report's series time on a long step log.
        starts = np.concatenate(([0], np.flatnonzero(bucket[1:] != bucket[:-1]) + 1))
        counts = np.diff(np.append(starts, x.size))
        return centres[bucket[starts]], np.add.reduceat(y, starts) / counts, np.maximum.reduceat(y, starts)
    counts = np.bincount(bucket, minlength=num_buckets)
    sums = np.bincount(bucket, weights=y, minlength=num_buckets)
    maxes = np.full(num_buckets, -np.inf)
    np.maximum.at(maxes, bucket, y)
    present = counts > 0
    return centres[present], sums[present] / counts[present], maxes[present]


def _sorted_bucket_mean_max(x: np.ndarray, y: np.ndarray, num_buckets: int) -> tuple[np.ndarray, ...]:
    """`bucket_mean_max` of a time series (``x`` finite and ascending, as a step log's start times): each bucket is
    one run of rows, found by bisection instead of computing every row's bucket (five passes over 1.8M rows, six
    series a report: most of its time series' CPU time). A row's bucket is computed by the same expression as for
    every row, which never decreases along an ascending ``x``, so the runs are the same rows to the bit."""
    x_min, x_max = float(x[0]), float(x[-1])  # ascending, finite: the minimum and the maximum
    width = (x_max - x_min) / num_buckets or 1.0

    def bucket_of(rows: np.ndarray) -> np.ndarray:
        return np.clip(((x[rows] - x_min) / width).astype(np.int64), 0, num_buckets - 1)

    # Each bucket's first row (the row count for a bucket no row reaches): the first row whose bucket is not below
    # it, bisected for all buckets at once.
    wanted = np.arange(1, num_buckets)
    low = np.zeros(wanted.size, dtype=np.int64)
    high = np.full(wanted.size, x.size, dtype=np.int64)
    while True:
        open_ = low < high
        if not open_.any():
            break
        middle = (low + high) // 2
        reached = np.zeros(wanted.size, dtype=bool)
        reached[open_] = bucket_of(middle[open_]) >= wanted[open_]
        high = np.where(open_ & reached, middle, high)
        low = np.where(open_ & ~reached, middle + 1, low)
    starts = np.unique(np.concatenate(([0], low[low < x.size])))
    counts = np.diff(np.append(starts, x.size))
    centres = x_min + (np.arange(num_buckets) + 0.5) * width
    return centres[bucket_of(starts)], np.add.reduceat(y, starts) / counts, np.maximum.reduceat(y, starts)


def _median_below(values: np.ndarray, limit: float) -> bool:
    """``np.median(values) < limit`` for finite ``values``, most often from a count instead of a
    partition of a copy (1.8M steps' batch sizes: 3 ms instead of 25). The median is the middle value, or the mean
    of the middle two, which lies below ``limit`` when both do (their rounded sum is at most twice the larger, exact)
    and not when neither does; only when the limit falls between them is the median itself computed."""
    if not limit < 1e299:  # the sum of the middle two could overflow
        return bool(np.median(values) < limit)
    num_below = int(np.count_nonzero(values < limit))
    half, odd = divmod(values.size, 2)
    if odd:
        return num_below > half
    if num_below != half:
        return num_below > half
    return bool(np.median(values) < limit)


def histogram_edges(values: np.ndarray, max_bins: int = 60) -> tuple[np.ndarray, bool]:
    """Bin edges that show the shape of `values`, and whether the x axis should be logarithmic.

    - whole numbers with at most `max_bins` distinct values: one bin per value (a batch size);
    - positive values spanning more than two decades, most of them far below the largest (a decode
      step of 64 tokens beside prefill steps of 8,192): log-spaced bins, else one bar holds nearly all;
    - otherwise numpy's "auto" rule, capped at `max_bins` bins.
    """
    values = np.asarray(values, dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    if low == high:
        return np.array([low - 0.5, high + 0.5]), False
    whole = bool(np.all(values == np.round(values)))
    if whole and high - low + 1 <= max_bins:
        return np.arange(low - 0.5, high + 1.5), False
    if low > 0 and high / low > 100 and _median_below(values, high / 10):
        return np.geomspace(low, high, max_bins + 1), True
    edges = np.histogram_bin_edges(values, bins="auto")
    if len(edges) - 1 > max_bins:
        edges = np.linspace(low, high, max_bins + 1)
    return edges, False
