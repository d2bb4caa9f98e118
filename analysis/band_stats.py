"""A prediction band's figures (median, p5, p95 over seeded replays) and where summary.json keeps them, apart
from the replays themselves (``analysis.bands``) so that readers of a summary need no simulator."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from analysis.stats import round_sig
from engine.core.messages import shown


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


def check_bands(bands: object) -> None:
    """Raise ValueError naming the first band of a summary's ``bands`` (as ``analysis.bands`` writes it) whose
    median, p5 or p95 is not a finite number or out of order: a hand-edited one was a KeyError or TypeError
    traceback where analysis.compare and the report read it."""
    if not isinstance(bands, Mapping) or not isinstance(bands.get("metrics"), Mapping):
        raise ValueError(f"'bands' is {shown(bands, 60)}; expected an object with 'metrics' (sim.replay --bands')")
    for key, band in flat_bands({"bands": bands}).items():
        values = [band.get(stat) for stat in ("p5", "median", "p95")]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in values) \
                or not values[0] <= values[1] <= values[2]:
            raise ValueError(f"the band of {key!r} is {shown(band)}; expected finite numbers p5 <= median <= p95")


def inside(band: Mapping[str, float], value: float | int | None) -> bool | None:
    """Whether ``value`` lies in the band's p5-p95 range (inclusive); None without a value."""
    if value is None:
        return None
    return float(band["p5"]) <= float(value) <= float(band["p95"])
