"""Run many capacity searches at once: the cross product of options, each bisected on QPS.

The process that drives the sweep holds every configuration's `CapacitySearch` and sends single
simulations (one configuration at one QPS) to an executor: in-process, a local process pool, or
a Ray cluster. A search only ever sees its own verdicts, so completion order cannot change any
decision and the results are identical whatever `--jobs` or executor ran them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field

import polars as pl

from analysis.capacity.bisection import CapacitySearch, SearchOutcome, SearchParams
from analysis.capacity.slo_check import check_slos
from analysis.formatting import LATENCY_LABELS
from analysis.metrics import summarize
from analysis.slo import SLO
from analysis.stats import round_sig
from engine.core.config_args import flag_of
from sim.config import SimConfig
from sim.simulator import simulate

# SimConfig field -> the CLI option that lists its values; the cross product follows this order.
SWEEP_AXES: dict[str, str] = {
    name: flag_of(SimConfig.__dataclass_fields__[name])
    for name in ("model", "gpu", "num_replicas", "tensor_parallel_size", "policy", "max_num_seqs", "router")
}
# SimConfig field -> how a chart label shows its value.
_LABEL_FORMATS: dict[str, str] = {"model": "{}", "gpu": "{}", "num_replicas": "x{}", "tensor_parallel_size": "tp{}",
                                  "policy": "{}", "max_num_seqs": "seqs{}", "router": "router {}"}
# PointResult fields copied from the replay's summary under the same name.
_SUMMARY_FIELDS = ("num_requests", "num_finished", "num_rejected", "duration_s", "total_output_tokens",
                   "prefix_cache_hit_rate", "num_preemptions")
# A replay whose arrivals span at most this share of its duration is (nearly) one burst: higher QPS
# cannot load it more, so a passing burst ends the upward search (see analysis.capacity.bisection).
BURST_SPAN_FRACTION = 0.05


class SweepError(Exception):
    """A sweep that cannot start (bad options, missing Ray); the message names the option."""


def expand_configs(base: SimConfig, axes: Mapping[str, Sequence]) -> list[SimConfig]:
    """Every combination of `axes` (SimConfig field -> values) applied to `base`, in SWEEP_AXES order.

    Fields not in `axes` keep `base`'s value; an empty list of values is an error naming its option.
    """
    unknown = [name for name in axes if name not in SWEEP_AXES]
    if unknown:
        raise SweepError(f"cannot sweep {', '.join(unknown)}; sweepable: {', '.join(SWEEP_AXES)}")
    names = [name for name in SWEEP_AXES if name in axes]
    for name in names:
        if len(axes[name]) == 0:
            raise SweepError(f"{SWEEP_AXES[name]}: empty list; give at least one value")
    return [dataclasses.replace(base, **dict(zip(names, values)))
            for values in itertools.product(*(axes[n] for n in names))]


def config_label(config: SimConfig, varying: Iterable[str] | None = None) -> str:
    """A short name for charts: the swept options that differ between configurations.

    With nothing varying, the model, GPU and replica count, so a one-configuration sweep still
    reads well.
    """
    names = [n for n in SWEEP_AXES if n in set(varying or ())] or ["model", "gpu", "num_replicas"]
    return _options_text(config, names)


def family_label(config: SimConfig, varying: Iterable[str]) -> str:
    """`config_label` without the replica count: names a family measured at several counts."""
    names = [n for n in SWEEP_AXES if n in set(varying) and n != "num_replicas"] or ["model", "gpu"]
    return _options_text(config, names)


def _options_text(config: SimConfig, names: Iterable[str]) -> str:
    return " ".join(_LABEL_FORMATS[name].format(getattr(config, name)) for name in names)


def varying_axes(configs: Sequence[SimConfig]) -> list[str]:
    """The sweepable fields that take more than one value among `configs`."""
    return [n for n in SWEEP_AXES if len({getattr(c, n) for c in configs}) > 1]


@dataclass(frozen=True)
class PointResult:
    """The outcome of one simulation: a configuration replaying the trace at `qps`.

    Latency statistics are in ms (`slo_values_ms` per SLO key, None when unbounded because
    requests were rejected or when there are no samples); rates per second of the replay's makespan.
    """

    qps: float
    meets_slos: bool
    goodput_rps: float
    slo_values_ms: dict[str, float | None]
    num_requests: int
    num_finished: int
    num_rejected: int
    duration_s: float
    arrival_span_s: float
    request_throughput_rps: float | None
    output_throughput_tok_s: float | None
    total_output_tokens: int
    prefix_cache_hit_rate: float | None
    num_preemptions: int
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def output_tokens_per_request(self) -> float:
        """Output tokens served per request offered (rejected ones serve none)."""
        return self.total_output_tokens / self.num_requests if self.num_requests else 0.0

    @property
    def is_burst(self) -> bool:
        """The trace arrived within a small share of the replay: more QPS would change little."""
        return self.arrival_span_s <= BURST_SPAN_FRACTION * self.duration_s


def evaluate_point(trace, slos: Sequence[SLO], config: SimConfig, qps: float) -> PointResult:
    """Simulate `config` on `trace` rescaled to `qps` requests/s and judge it against `slos`."""
    scaled = trace.with_qps(qps)
    arrivals = scaled.requests["arrival_s"]
    result = simulate(scaled, config)
    requests = pl.from_arrow(result.requests_table())
    steps = pl.from_arrow(result.steps_table())
    summary = summarize(requests, steps, slos)  # goodput included
    check = check_slos(requests, slos)
    return PointResult(
        qps=qps,
        meets_slos=check.meets_slos,
        goodput_rps=summary["goodput"],
        slo_values_ms={key: round_sig(value) for key, value in check.values_ms.items()},
        arrival_span_s=round_sig(float(arrivals[-1] - arrivals[0])),
        request_throughput_rps=summary["request_throughput"],
        output_throughput_tok_s=summary["output_throughput"],
        latency_ms={f"{metric}_ms": dict(summary[f"{metric}_ms"]) for metric in LATENCY_LABELS},
        **{name: summary[name] for name in _SUMMARY_FIELDS},
    )


@dataclass(frozen=True)
class ConfigResult:
    """One configuration's search: its options, the points tried (in order) and the outcome."""

    index: int
    config: SimConfig
    label: str
    outcome: SearchOutcome
    points: tuple[PointResult, ...]

    @property
    def max_qps(self) -> float | None:
        return self.outcome.max_qps

    @property
    def point_at_max(self) -> PointResult | None:
        """The simulation at max_qps: the latencies and token rate the capacity figures use."""
        if self.max_qps is None:
            return None
        return next(p for p in self.points if p.qps == self.max_qps)


class Executor:
    """Runs `evaluate_point(trace, slos, config, qps)` somewhere; `submit` returns a Future."""

    def submit(self, config: SimConfig, qps: float) -> Future:
        raise NotImplementedError

    def close(self, interrupted: bool = False) -> None:
        """Release workers; pending work is cancelled, and running work too when ``interrupted``."""


# ---- the driver ----------------------------------------------------------------------------------
def run_sweep(
    configs: Sequence[SimConfig],
    params: SearchParams,
    executor: Executor,
    labels: Sequence[str] | None = None,
    progress_bar=None,
) -> list[ConfigResult]:
    """Search every configuration's max QPS; searches proceed concurrently on `executor`.

    `progress_bar` (e.g. tqdm) counts simulations; its total starts at the worst case
    (configurations x max_iterations) and shrinks as searches converge.
    """
    labels = list(labels) if labels is not None else [config_label(c, varying_axes(configs)) for c in configs]
    searches = [CapacitySearch(params) for _ in configs]
    points: list[dict[float, PointResult]] = [{} for _ in configs]
    waiting: list[set[float]] = [set() for _ in configs]
    in_flight: dict[Future, tuple[int, float]] = {}
    if progress_bar is not None:
        progress_bar.total = len(configs) * params.max_iterations
        progress_bar.refresh()

    def launch(index: int) -> None:
        search = searches[index]
        for qps in search.propose():
            waiting[index].add(qps)
            in_flight[executor.submit(configs[index], qps)] = (index, qps)
        unused = params.max_iterations - search.num_evaluated
        if search.done and unused and progress_bar is not None:
            progress_bar.total -= unused
            progress_bar.refresh()

    try:
        for index in range(len(configs)):
            launch(index)
        while in_flight:
            # A bounded wait: Ctrl-C may be delivered to a pool thread, and the main thread only sees it
            # once it wakes up; without a timeout that is when the next simulation finishes.
            finished, _ = wait(list(in_flight), timeout=0.2, return_when=FIRST_COMPLETED)
            for future in finished:
                index, qps = in_flight.pop(future)
                points[index][qps] = future.result()
                waiting[index].discard(qps)
                if progress_bar is not None:
                    progress_bar.update(1)
                if not waiting[index]:  # the search's whole round is back
                    search = searches[index]
                    round_points = [points[index][q] for q in search.pending]
                    search.observe({p.qps: p.meets_slos for p in round_points},
                                   {p.qps for p in round_points if p.is_burst})
                    launch(index)
    except BaseException:  # Ctrl-C or a failed simulation: stop everything still running, now
        executor.close(interrupted=True)
        raise
    executor.close()
    results = []
    for index, (config, search) in enumerate(zip(configs, searches)):
        outcome = search.outcome()
        tried = tuple(points[index][qps] for qps, _ in outcome.points)
        results.append(ConfigResult(index, config, labels[index], outcome, tried))
    return results
