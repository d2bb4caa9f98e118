"""Whether one replay meets every SLO: the yes/no question a capacity search asks of each load.

Semantics, chosen so that a replay cannot pass by dropping work:
- The statistic of an SLO is taken over every request of the replay. A request that did not finish
  (rejected or aborted) counts as an infinitely slow one, so, for example, more than 10 % rejected
  requests fail any p90 SLO, and any rejected request fails a ``mean`` SLO.
- ITL pools every gap between consecutive tokens of finished requests, plus one infinite gap per
  unfinished request. TPOT, like vLLM, has no value for outputs of one token; those are skipped.
- A statistic with no samples at all (a TPOT SLO when every output is one token) is met.
The per-request rule (goodput) is `analysis.metrics.requests_meeting_slos`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from analysis.metrics import add_latency_columns, is_finished, itl_values, latency_column
from analysis.slo import SLO, statistic_of
from analysis.stats import MS_PER_S


def metric_samples_s(latencies: pl.DataFrame, metric: str) -> np.ndarray:
    """The samples an SLO statistic is taken over (see the module docstring), in seconds."""
    finished = latencies.filter(is_finished())
    num_unfinished = latencies.height - finished.height
    column = latency_column(metric)
    values = itl_values(finished) if column is None else finished[column].drop_nulls().to_numpy()
    return np.concatenate([values.astype(np.float64, copy=False), np.full(num_unfinished, np.inf)])


@dataclass(frozen=True)
class SLOCheck:
    """The statistic of every SLO in one replay (ms; None: no samples, or infinite) and the verdict."""

    values_ms: dict[str, float | None]
    meets_slos: bool


def check_slos(requests: pl.DataFrame, slos: Iterable[SLO]) -> SLOCheck:
    """Whether a replay meets every SLO, and each SLO's measured statistic."""
    latencies = add_latency_columns(requests)
    values_ms: dict[str, float | None] = {}
    meets = True
    for slo in slos:
        value_s = statistic_of(metric_samples_s(latencies, slo.metric), slo.statistic)
        if value_s is not None and not value_s <= slo.limit_s:
            meets = False
        values_ms[slo.key] = value_s * MS_PER_S if value_s is not None and math.isfinite(value_s) else None
    return SLOCheck(values_ms=values_ms, meets_slos=meets)
