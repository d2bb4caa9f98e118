"""The per-metric error table of a sim-vs-real comparison.

Errors are signed and relative, (sim - real) / real, so "+0.10" reads "the
simulator says 10 % more". Both sides' numbers are recomputed here from their
tables with `analysis.metrics.summarize`, so a difference can only come from
the runs themselves, never from two versions of the metric code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import polars as pl

from analysis.band_stats import inside
from analysis.formatting import LATENCY_LABELS, SERVICE_LATENCIES
from analysis.metrics import summarize
from analysis.stats import MS_PER_S, STATISTIC_NAMES, round_sig

# Latency rows of the error table, four statistics each (queue time is not compared).


@dataclass(frozen=True)
class MetricSpec:
    """One row of the error table: where its value lives in a flat metrics dict, and its unit.

    `kind` tells renderers how to print it: "count" values are integers (their
    absolute difference matters more than a relative one), "fraction" values
    are 0..1 shares.
    """

    key: str
    label: str
    unit: str
    kind: str = "value"


METRIC_SPECS: tuple[MetricSpec, ...] = (
    *(
        MetricSpec(f"{metric}_ms.{stat}", f"{LATENCY_LABELS[metric]} {stat}", "ms", "latency")
        for metric in SERVICE_LATENCIES
        for stat in STATISTIC_NAMES
    ),
    MetricSpec("output_throughput", "output throughput", "tok/s"),
    MetricSpec("request_throughput", "request throughput", "req/s"),
    # vLLM's serving benchmark prints these too (`analysis.vllm_metrics`); labels no wider than the rows above, so the
    # text table keeps its columns.
    MetricSpec("total_token_throughput", "total throughput", "tok/s"),
    MetricSpec("max_output_tokens_per_s", "peak output rate", "tok/s"),
    MetricSpec("max_concurrent_requests", "max concurrent requests", "", "count"),
    MetricSpec("duration_s", "makespan", "s"),
    MetricSpec("num_finished", "finished requests", "", "count"),
    MetricSpec("num_rejected", "rejected requests", "", "count"),
    MetricSpec("num_preemptions", "preemptions", "", "count"),
    MetricSpec("prefix_cache_hit_rate", "prefix-cache hit rate", "", "fraction"),
    MetricSpec("num_steps", "engine steps", "", "count"),
    MetricSpec("mean_step_duration_ms", "mean step duration", "ms"),
)


@dataclass(frozen=True)
class MetricRow:
    """Real and simulated value of one metric, their difference and signed relative error."""

    key: str
    label: str
    unit: str
    kind: str
    real: float | int | None
    sim: float | int | None
    diff: float | int | None
    rel_error: float | None
    band: dict | None = None  # the sim side's prediction band ({median, p5, p95}) when it ran with --bands
    in_band: bool | None = None  # the real figure lies in the band's p5-p95 range
    note: str | None = None  # why the two are not compared, shown for the relative error

    @property
    def title(self) -> str:
        """The label with its unit, e.g. "TTFT p50 (ms)"."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def to_dict(self) -> dict:
        """JSON-ready fields plus the display title (the band's only when the sim side has bands)."""
        fields = asdict(self)
        if self.band is None:
            del fields["band"], fields["in_band"]
        if self.note is None:
            del fields["note"]
        return {**fields, "title": self.title}


def relative_error(real: float | int | None, sim: float | int | None) -> float | None:
    """Signed (sim - real) / |real|; None when either is missing or real is 0 (undefined)."""
    if real is None or sim is None or real == 0:
        return None
    return round_sig((float(sim) - float(real)) / abs(float(real)))


def _difference(real: float | int | None, sim: float | int | None) -> float | int | None:
    if real is None or sim is None:
        return None
    if isinstance(real, int) and isinstance(sim, int):
        return sim - real
    return round_sig(float(sim) - float(real))


def mean_step_duration_ms(steps: pl.DataFrame) -> float | None:
    """Mean engine step duration in ms (None without steps): the cost model's average error."""
    if steps.height == 0:
        return None
    mean_s = steps["duration_s"].mean()
    return None if mean_s is None else round_sig(float(mean_s) * MS_PER_S)


def flatten_summary(summary: Mapping) -> dict[str, float | int | None]:
    """A summary with nested latency stats flattened to "ttft_ms.p50"-style keys."""
    flat: dict[str, float | int | None] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{stat}": number for stat, number in value.items()})
        elif isinstance(value, (int, float)) or value is None:
            flat[key] = value
    return flat


def run_metrics(requests: pl.DataFrame, steps: pl.DataFrame, duration_s: float | None = None,
                timed_by_client: bool = False,
                prefix_caching: bool = True) -> tuple[dict, dict[str, float | int | None]]:
    """(summarize() dict, flat metrics dict with every `METRIC_SPECS` key) of one run; `duration_s` replaces
    the makespan for a run that recorded its own (an imported vLLM result), `timed_by_client` and `prefix_caching`
    as `summarize`."""
    summary = summarize(requests, steps, duration_s=duration_s, timed_by_client=timed_by_client,
                        prefix_caching=prefix_caching)
    summary["mean_step_duration_ms"] = mean_step_duration_ms(steps)
    return summary, flatten_summary(summary)


def prefix_caching_note(real_caches: bool, sim_caches: bool) -> dict[str, str]:
    """{metric key: why it is not compared} for the hit rate of a side run without a prefix cache: its rate is
    undefined (None), so a missing figure beside the other side's is no error of the simulator."""
    off = [name for name, caches in (("real", real_caches), ("sim", sim_caches)) if not caches]
    if not off:
        return {}
    return {"prefix_cache_hit_rate": f"not compared: prefix caching off ({' and '.join(off)})"}


def error_table(real: Mapping[str, float | int | None], sim: Mapping[str, float | int | None],
                bands: Mapping[str, Mapping] | None = None, notes: Mapping[str, str] | None = None) -> list[MetricRow]:
    """One `MetricRow` per `METRIC_SPECS` entry from two flat metrics dicts (see `run_metrics`); `bands` (the sim
    side's, `analysis.band_stats.flat_bands`) adds each metric's band and whether the real figure is inside;
    `notes` ({key: reason}, `prefix_caching_note`) says why a metric is not compared."""
    rows = []
    for spec in METRIC_SPECS:
        real_value, sim_value = real.get(spec.key), sim.get(spec.key)
        band = (bands or {}).get(spec.key)
        rows.append(MetricRow(**asdict(spec), real=real_value, sim=sim_value, diff=_difference(real_value, sim_value),
                              rel_error=relative_error(real_value, sim_value), band=band,
                              in_band=None if band is None else inside(band, real_value),
                              note=(notes or {}).get(spec.key)))
    return rows
