"""Latency SLOs such as ``ttft_p90=2s``: parsing, and checking a replay against them.

A capacity sweep asks one yes/no question per replay ("does this load meet every SLO?") and one
count ("how many requests met all of them?", vLLM's goodput), so both live here, next to the
syntax they are written in.

Semantics, chosen so that a replay cannot pass by dropping work:
- The statistic of an SLO is taken over every request of the replay. A request that did not finish
  (rejected or aborted) counts as an infinitely slow one, so, for example, more than 10 % rejected
  requests fail any p90 SLO, and any rejected request fails a ``mean`` SLO.
- ITL pools every gap between consecutive tokens of finished requests, plus one infinite gap per
  unfinished request. TPOT, like vLLM, has no value for outputs of one token; those are skipped.
- A statistic with no samples at all (a TPOT SLO when every output is one token) is met.
- Goodput counts requests that finished and, for each SLO, have their own value (for ITL: the
  SLO's statistic of their own gaps) within the limit. Two SLOs on one metric (``ttft_p50=1s,
  ttft_p99=3s``) thus apply the stricter limit to each request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import polars as pl

from analysis.metrics import MS_PER_S, add_latency_columns, makespan_s, meets_slos
from analysis.schema import FINISHED_REASONS, conform_requests

__all__ = [
    "METRICS",
    "STATISTICS",
    "SLO",
    "SLOCheck",
    "check_slos",
    "goodput_rps",
    "parse_slos",
    "percentile",
    "requests_meeting_slos",
]

# metric name -> the per-request latency column of analysis.metrics (None: ITL, pooled gaps).
METRICS: dict[str, str | None] = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": None, "e2e": "e2e_s", "queue": "queue_s"}
# statistic name -> percentile (None: the mean).
STATISTICS: dict[str, float | None] = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "mean": None}
UNITS_TO_S: dict[str, float] = {"ms": 1e-3, "s": 1.0}

_SLO_PATTERN = re.compile(r"^\s*([a-z0-9]+)_([a-z0-9]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")
SYNTAX = "metric_statistic=value+unit, e.g. ttft_p90=2s,tpot_p90=100ms"


@dataclass(frozen=True)
class SLO:
    """One limit on one statistic of one latency metric, e.g. TTFT p90 <= 2 s."""

    metric: str
    statistic: str
    limit_s: float

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"unknown SLO metric {self.metric!r}; supported: {', '.join(METRICS)}")
        if self.statistic not in STATISTICS:
            raise ValueError(f"unknown SLO statistic {self.statistic!r}; supported: {', '.join(STATISTICS)}")
        if not (math.isfinite(self.limit_s) and self.limit_s > 0):
            raise ValueError(f"SLO limit must be a finite number > 0 seconds, got {self.limit_s!r}")

    @property
    def key(self) -> str:
        """``ttft_p90``: the name of this SLO's column in outputs (suffixed with ``_ms``)."""
        return f"{self.metric}_{self.statistic}"

    @property
    def limit_ms(self) -> float:
        return self.limit_s * MS_PER_S

    @property
    def label(self) -> str:
        """Human-readable, for chart titles: ``TTFT p90``."""
        return f"{self.metric.upper()} {self.statistic}"

    def __str__(self) -> str:
        return f"{self.key}={format_duration(self.limit_s)}"


def format_duration(seconds: float) -> str:
    """``2s`` or ``100ms``: the shortest SLO-syntax spelling of a limit."""
    if seconds >= 1.0:
        return f"{seconds:g}s"
    return f"{seconds * MS_PER_S:g}ms"


def parse_slos(text: str) -> tuple[SLO, ...]:
    """Parse ``ttft_p90=2s,tpot_p90=100ms``; ValueError says which item is wrong and why."""
    items = [item for item in (part.strip() for part in text.split(",")) if item]
    if not items:
        raise ValueError(f"no SLO given; expected {SYNTAX}")
    slos: list[SLO] = []
    seen: set[str] = set()
    for item in items:
        match = _SLO_PATTERN.match(item.lower())
        if match is None:
            raise ValueError(f"cannot parse SLO {item!r}; expected {SYNTAX}")
        metric, statistic, value, unit = match.groups()
        if unit not in UNITS_TO_S:
            raise ValueError(f"SLO {item!r} needs a unit; supported: {', '.join(UNITS_TO_S)} (e.g. 2s or 100ms)")
        try:
            slo = SLO(metric, statistic, float(value) * UNITS_TO_S[unit])
        except ValueError as exc:
            raise ValueError(f"SLO {item!r}: {exc}") from None
        if slo.key in seen:
            raise ValueError(f"SLO {slo.key} is given twice")
        seen.add(slo.key)
        slos.append(slo)
    return tuple(slos)


def percentile(sorted_values: np.ndarray, q: float) -> float:
    """Linear-interpolation percentile (numpy's default) that tolerates +inf samples.

    numpy returns NaN when it interpolates towards an infinite sample; here the result is +inf
    then, which is what "an unfinished request is infinitely slow" means.
    """
    n = sorted_values.size
    position = (n - 1) * q / 100.0
    lower = int(math.floor(position))
    upper = min(lower + 1, n - 1)
    fraction = position - lower
    low_value = float(sorted_values[lower])
    if fraction == 0.0 or upper == lower:
        return low_value
    high_value = float(sorted_values[upper])
    if math.isinf(high_value):
        return math.inf
    return low_value + (high_value - low_value) * fraction


def statistic_of(values: np.ndarray, statistic: str) -> float | None:
    """The SLO statistic of `values` (seconds, +inf allowed); None without values."""
    if values.size == 0:
        return None
    q = STATISTICS[statistic]
    if q is None:
        return float(values.mean())
    return percentile(np.sort(values), q)


def _is_finished() -> pl.Expr:
    return pl.col("finish_reason").is_in(FINISHED_REASONS).fill_null(False)


def metric_samples_s(latencies: pl.DataFrame, metric: str) -> np.ndarray:
    """The samples an SLO statistic is taken over (see the module docstring), in seconds."""
    finished = latencies.filter(_is_finished())
    num_unfinished = latencies.height - finished.height
    column = METRICS[metric]
    if column is None:
        values = finished["token_times_s"].list.diff().explode().drop_nulls().to_numpy()
    else:
        values = finished[column].drop_nulls().to_numpy()
    values = values.astype(np.float64, copy=False)
    return np.concatenate([values, np.full(num_unfinished, np.inf)])


@dataclass(frozen=True)
class SLOCheck:
    """The statistic of every SLO in one replay (ms; None: no samples, or infinite) and the verdict."""

    values_ms: dict[str, float | None]
    meets_slos: bool


def check_slos(requests: pl.DataFrame, slos: Iterable[SLO]) -> SLOCheck:
    """Whether a replay meets every SLO, and each SLO's measured statistic."""
    latencies = add_latency_columns(conform_requests(requests, ["token_times_s"]))
    values_ms: dict[str, float | None] = {}
    meets = True
    for slo in slos:
        value_s = statistic_of(metric_samples_s(latencies, slo.metric), slo.statistic)
        if value_s is not None and not value_s <= slo.limit_s:
            meets = False
        values_ms[slo.key] = value_s * MS_PER_S if value_s is not None and math.isfinite(value_s) else None
    return SLOCheck(values_ms=values_ms, meets_slos=meets)


def _per_request_itl_s(latencies: pl.DataFrame, statistic: str) -> pl.Series:
    """Each request's own ITL statistic (s); null with fewer than two tokens."""
    values = [
        statistic_of(np.diff(np.asarray(times, dtype=np.float64)), statistic) if times is not None else None
        for times in latencies["token_times_s"].to_list()
    ]
    return pl.Series("itl_s", values, dtype=pl.Float64)


def requests_meeting_slos(requests: pl.DataFrame, slos: Iterable[SLO]) -> pl.Series:
    """Per request: finished and within every SLO limit (vLLM's goodput criterion), never null."""
    slos = tuple(slos)
    limits_s: Mapping[str, float] = {}
    for slo in slos:
        if METRICS[slo.metric] is not None:
            key = f"{slo.metric}_s"
            limits_s[key] = min(limits_s.get(key, math.inf), slo.limit_s)
    passes = meets_slos(requests, limits_s)
    itl_slos = [slo for slo in slos if slo.metric == "itl"]
    if itl_slos:
        latencies = conform_requests(requests, ["token_times_s"])
        for slo in itl_slos:
            within = (_per_request_itl_s(latencies, slo.statistic) <= slo.limit_s).fill_null(True)
            passes = passes & within
    return passes.alias("meets_slos")


def goodput_rps(requests: pl.DataFrame, slos: Iterable[SLO]) -> float:
    """Requests per second that finished within every SLO, over the replay's makespan."""
    duration_s = makespan_s(requests)
    if duration_s <= 0:
        return 0.0
    return float(requests_meeting_slos(requests, slos).sum()) / duration_s
