"""Order statistics read by index from a sorted array (``analysis.stats.percentile``, ``sorted_median``) are numpy's
own to the bit, scaled or not: a summary takes its token gaps' percentiles so where a report sorted them already."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.stats import latency_stats, percentile, sorted_median
from analysis.vllm_metrics import _stats_ms


def _samples(seed: int, size: int) -> np.ndarray:
    """Token-gap-like samples with ties (steps shared by a batch), sorted."""
    rng = np.random.default_rng(seed)
    return np.sort(np.round(rng.exponential(0.03, size), int(rng.integers(3, 12))))


@pytest.mark.parametrize("size", [1, 2, 3, 10, 101, 1000, 4097])
@pytest.mark.parametrize("scale", [1.0, 1e3])
def test_sorted_order_statistics_are_numpys_to_the_bit(size: int, scale: float) -> None:
    for seed in range(20):
        ordered = _samples(seed, size)
        scaled = ordered * scale
        for q in (0.0, 1.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0):
            assert percentile(ordered, q, scale) == float(np.percentile(scaled, q))
        assert sorted_median(ordered, scale) == float(np.median(scaled))


def test_sorted_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert sorted_median(np.array([1.0, 2.0, 4.0, 8.0])) == 3.0
    assert sorted_median(np.array([1.0, 2.0, 4.0]), 10.0) == 20.0


@pytest.mark.parametrize("size", [1, 2, 999, 1000])
def test_summary_statistics_from_sorted_values_equal_numpys(size: int) -> None:
    for seed in range(10):
        values = np.random.default_rng(seed).permutation(_samples(seed, size))
        ordered = np.sort(values)
        assert latency_stats(values, ordered) == latency_stats(values)
        assert _stats_ms(values, ordered) == _stats_ms(values)
