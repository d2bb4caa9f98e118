"""A prediction band's figures (median, p5, p95 over seeded replays) and where summary.json keeps them, apart
from the replays themselves (``analysis.bands``) so that readers of a summary need no simulator."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from analysis.stats import round_sig


def band_of(values: list[float]) -> dict[str, float]:
    """Median and p5/p95 (linear interpolation between replays), ordered p5 <= median <= p95."""
    p5, median, p95 = np.percentile(np.array(values, dtype=float), [5, 50, 95])
    return {"median": round_sig(float(median)), "p5": round_sig(float(p5)), "p95": round_sig(float(p95))}


def flat_bands(summary: Mapping) -> dict[str, dict[str, float]]:
    """A summary's bands flattened to the compare table's keys ("ttft_ms.p50" -> {median, p5, p95}); {} without."""
    bands = summary.get("bands")
    if not isinstance(bands, Mapping) or not isinstance(bands.get("metrics"), Mapping):
        return {}
    flat = {}
    for metric, value in bands["metrics"].items():
        if not isinstance(value, Mapping):
            continue
        if "median" in value:
            flat[metric] = dict(value)
        else:
            flat.update({f"{metric}.{stat}": dict(band) for stat, band in value.items() if isinstance(band, Mapping)})
    return flat


def inside(band: Mapping[str, float], value: float | int | None) -> bool | None:
    """Whether ``value`` lies in the band's p5-p95 range (inclusive); None without a value."""
    if value is None:
        return None
    return float(band["p5"]) <= float(value) <= float(band["p95"])
