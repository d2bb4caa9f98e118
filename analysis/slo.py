"""Latency SLOs such as ``ttft_p90=2s``: the one SLO type of every tool, its syntax, and how its
statistic is taken.

How a replay is judged against SLOs: per request (vLLM's goodput) in `analysis.metrics`, per replay
(a capacity sweep's pass/fail) in `analysis.capacity.slo_check`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from analysis.formatting import LATENCY_LABELS
from analysis.stats import MS_PER_S, percentile

# statistic name -> percentile (None: the mean).
STATISTICS: dict[str, float | None] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "mean": None}
UNITS_TO_S: dict[str, float] = {"ms": 1e-3, "s": 1.0}
# A limit whose value in ms is still a float (SLO.limit_ms; 1.8e305 s is not): one this long limits nothing anyway.
MAX_LIMIT_S = 1e305

# The value may carry a sign so that a negative limit is refused as negative rather than as unparseable.
_SLO_PATTERN = re.compile(r"^\s*([a-z0-9]+)_([a-z0-9]+)\s*=\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")
SYNTAX = "metric_statistic=value+unit, e.g. ttft_p90=2s,tpot_p90=100ms"


@dataclass(frozen=True)
class SLO:
    """One limit on one statistic of one latency metric, e.g. TTFT p90 <= 2 s."""

    metric: str
    statistic: str
    limit_s: float

    def __post_init__(self) -> None:
        if self.metric not in LATENCY_LABELS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; supported: {', '.join(LATENCY_LABELS)}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"unknown SLO statistic {self.statistic!r}; supported: {', '.join(STATISTICS)}")
        if not (math.isfinite(self.limit_s) and self.limit_s > 0):
            raise ValueError(f"SLO limit must be a finite number > 0 seconds, got {self.limit_s!r}")
        # Outputs keep the limit in ms (slos_ms): a limit above the float range there (ttft_p90=1e308s) was written
        # as Infinity into capacity.json, which no strict JSON reader takes, and sim.replay simulated, then could not
        # write summary.json and blamed its cost model.
        if self.limit_s > MAX_LIMIT_S:
            raise ValueError(f"SLO limit must be at most {MAX_LIMIT_S:g} seconds (outputs keep it in ms), got "
                             f"{self.limit_s!r}")

    @property
    def key(self) -> str:
        """``ttft_p90``: the name of this SLO's column in outputs (suffixed with ``_ms``)."""
        return f"{self.metric}_{self.statistic}"

    @property
    def limit_ms(self) -> float:
        """The limit in ms, from the limit's shortest decimal: 0.0021 * 1e3 is 2.1000000000000005, which summary.json
        kept as slos_ms and `analysis.summarize` read back as another limit (2.1000000000000005 / 1e3 is not 0.0021)."""
        return float(Decimal(repr(self.limit_s)).scaleb(3))

    @property
    def label(self) -> str:
        """Human-readable, for chart titles: ``TTFT p90``."""
        return f"{LATENCY_LABELS[self.metric]} {self.statistic}"

    def __str__(self) -> str:
        return f"{self.key}={format_duration(self.limit_s)}"


def format_duration(seconds: float) -> str:
    """``2s`` or ``100ms``: the shortest SLO-syntax spelling of a limit."""
    if seconds >= 1.0:
        return f"{seconds:g}s"
    return f"{seconds * MS_PER_S:g}ms"


def _limit_s(value: str, unit: str) -> float:
    """The limit ``value`` ``unit`` in seconds, rounded once from its decimal text. float(value) * 1e-3 rounded
    twice: 700ms became 0.7000000000000001 s, above 0.7s's 0.7, so a TTFT of 0.8 - 0.1 = 0.7000000000000001 s met
    ttft_p90=700ms and missed ttft_p90=0.7s (one whole-ms limit in eight differed so from itself in seconds)."""
    return float(Decimal(value).scaleb(-3)) if unit == "ms" else float(Decimal(value) * Decimal(repr(UNITS_TO_S[unit])))


def limit_s_from_ms(limit_ms: float) -> float:
    """A limit in ms (summary.json's ``slos_ms``) in seconds: the same float as ``LIMITms`` parses to."""
    return _limit_s(repr(float(limit_ms)), "ms")


def parse_slos(text: str) -> tuple[SLO, ...]:
    """Parse ``ttft_p90=2s,tpot_p90=100ms``; ValueError says which item is wrong and why."""
    items = [item for item in (part.strip() for part in text.split(",")) if item]
    if not items:
        raise ValueError(f"no SLO given; expected {SYNTAX}")
    slos: dict[str, SLO] = {}
    for item in items:
        match = _SLO_PATTERN.match(item.lower())
        if match is None:
            raise ValueError(f"cannot parse SLO {item!r}; expected {SYNTAX}")
        metric, statistic, value, unit = match.groups()
        if value.startswith("-") and float(value) != 0:  # "cannot parse" alone left the reader guessing at -1s
            raise ValueError(f"cannot parse SLO {item!r}: the limit is negative; expected a duration > 0 ({SYNTAX})")
        if unit not in UNITS_TO_S:
            # 2us or 2h were told they "need a unit": they have one, just not one we take.
            other = f", and {unit!r} is not one of them" if unit else ""
            raise ValueError(f"SLO {item!r} needs a unit; supported: {', '.join(UNITS_TO_S)} (e.g. 2s or 100ms){other}")
        try:
            slo = SLO(metric, statistic, _limit_s(value, unit))
        except ValueError as exc:
            raise ValueError(f"SLO {item!r}: {exc}") from None
        if slo.key in slos:
            raise ValueError(f"SLO {slo.key} is given twice")
        slos[slo.key] = slo
    return tuple(slos.values())


def statistic_of(values: np.ndarray, statistic: str) -> float | None:
    """The SLO statistic of `values` (seconds, +inf allowed); None without values."""
    if values.size == 0:
        return None
    q = STATISTICS[statistic]
    if q is None:
        return float(values.mean())
    return percentile(np.sort(values), q)
