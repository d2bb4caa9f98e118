"""One simulation of a capacity search: a configuration serving one seed's steady stream at one QPS.

The verdict is `feasible`: the SLO statistics over the measured window hold (`analysis.capacity.slo_check`)
and the replay is stable over it (`analysis.capacity.stability`). A clearly overloaded load is
recognised on the first third of the stream and not simulated further (`stopped_early`), where the job asks for
that probe (`PointJob.probe`); and a run stops once it has certainly missed a TTFT or queue-time percentile SLO
(`analysis.capacity.certain_miss`, also `stopped_early`), with the verdict the whole run would have given, where the
job asks for it (`PointJob.certain_miss`). Both follow the workload's `early_stop` (`--no-early-stop` runs every
stream in full).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from analysis.capacity.certain_miss import CertainMiss
from analysis.capacity.slo_check import check_slos
from analysis.capacity.stability import measure_stability, stability_of
from analysis.capacity.workload import EmptyStream, SessionLibrary, WorkloadParams, steady_trace
from analysis.formatting import LATENCY_LABELS
from analysis.metrics import goodput_rps, summarize
from analysis.slo import SLO
from analysis.stats import round_sig
from engine.core.records import REQUEST_COLUMNS, requests_to_arrow
from sim.bands import band_replay
from sim.config import SimConfig
from sim.cost_model import CostModel
from sim.simulator import make_cost_model, simulate

# The probe that can stop an overloaded run early: the first third of the stream, measured after its
# first quarter, failing by this multiple of the stability tolerance (an overload of ~3x what the full
# run would call unstable) and missing an SLO too. Loads that close to the limit run in full.
PROBE_FRACTION = 1 / 3
PROBE_TOLERANCE_FACTOR = 3.0
# A probe whose measured window would hold fewer arrivals than this is not run: a p90 and a queue trend over a
# few dozen requests are noise (a 30 s mooncake stream at ~3 req/s failed its probe on 31 requests while the whole
# run, on 65, passed). Such short streams are cheap to simulate whole.
PROBE_MIN_REQUESTS = 100
# Where a simulator row (engine.core.records.request_row) holds the arrival and finish times.
_ARRIVAL, _FINISH = ([c.name for c in REQUEST_COLUMNS].index(name) for name in ("arrival_s", "finish_s"))
# PointResult fields copied from the measured window's summary under the same name.
_SUMMARY_FIELDS = ("num_finished", "num_rejected", "total_output_tokens", "prefix_cache_hit_rate", "num_preemptions")


@dataclass(frozen=True)
class PointJob:
    """What one simulation is: `duration_scale` 2 makes the stream twice as long (the T-versus-2T check);
    `band_replay`: the search is band replay number `seed` (`sim.bands`: its own host-speed episodes and
    cost-model offsets, as `sim.replay --bands` varies them). `probe`: simulate the stream's first third first
    and stop there when it is clearly overloaded (with the workload's `early_stop`); a probe that does not stop is
    simulated again as part of the whole stream, so it pays only where overloads are likely (the sweep asks for it
    while no load of the search has passed). `certain_miss`: stop the run once it has certainly missed an SLO
    (`analysis.capacity.certain_miss`, with the workload's `early_stop`; the sweep asks for it once a load passed)."""

    config: SimConfig
    qps: float
    seed: int
    duration_scale: float = 1.0
    band_replay: bool = False
    probe: bool = True
    certain_miss: bool = False


@dataclass(frozen=True)
class PointResult:
    """The outcome of one simulation, over its measured window (arrivals after the warm-up).

    Latency statistics are in ms (`slo_values_ms` per SLO key, None when unbounded because
    requests did not finish, or when there are no samples); rates per second of the window.
    `num_requests` counts the requests measured, `stream_requests` every request simulated.
    """

    qps: float
    seed: int
    duration_scale: float
    feasible: bool
    meets_slos: bool
    stable: bool
    stopped_early: bool
    # None for a point stopped early: what its part of the stream gave is not the load's goodput (at 58 req/s past
    # capacity, 36 req/s over the part simulated against 15.8 over the whole stream), and the report drew it beside
    # the whole runs' as if it were.
    goodput_rps: float | None
    slo_values_ms: dict[str, float | None]
    num_requests: int
    num_finished: int
    num_rejected: int
    stream_requests: int
    stream_duration_s: float
    warmup_s: float
    request_throughput_rps: float | None
    output_throughput_tok_s: float | None
    total_output_tokens: int
    prefix_cache_hit_rate: float | None
    num_preemptions: int | None
    stability: dict = field(default_factory=dict)
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def output_tokens_per_request(self) -> float:
        """Output tokens served per request offered (rejected ones serve none)."""
        return self.total_output_tokens / self.num_requests if self.num_requests else 0.0


@functools.lru_cache(maxsize=16)
def _cost_model(config: SimConfig) -> CostModel:
    """The cost model ``simulate`` makes for ``config``, made once per configuration of a sweep instead of once per
    simulation (a profile read and checked each time: ~0.5 % of the default sweep's CPU time). A cost model holds
    nothing a simulation changes: one simulation's replicas share it already."""
    return make_cost_model(config, config.model_shape)


def _judge(trace, job: PointJob, slos: Sequence[SLO], start_s: float, end_s: float, tolerance: float,
           stop_at_certain_miss: bool = False, on_request_done=None):
    """The measured window's requests, stability and SLO check, and when the simulation stopped (None: it ran to the
    end). ``stop_at_certain_miss`` stops it once an SLO is certainly missed (analysis.capacity.certain_miss): the
    window is then the part simulated, its requests in flight unfinished, and the SLO check misses as the whole
    run's would (the requests that decided it are among them)."""
    watch = (CertainMiss(trace.requests["arrival_s"].to_numpy(), start_s, end_s, slos) if stop_at_certain_miss
             else None)
    if job.band_replay:
        config, cost_model = band_replay(job.config, job.seed)
        result = simulate(trace, config, cost_model=cost_model, watch=watch, on_request_done=on_request_done)
    else:
        result = simulate(trace, job.config, cost_model=_cost_model(job.config), watch=watch,
                          on_request_done=on_request_done)
    # The stability check reads every request's arrival and finish, the rest only the measured window's requests:
    # those are tabled alone, in the rows' order (as filtering the whole table keeps it). Tabling every request, the
    # warm-up's token times too, and filtering the table copied the window's token times twice over (~5 % of a
    # capacity sweep's CPU time went to the tables and summaries of its points).
    rows = result.request_rows
    arrival_s = np.fromiter((row[_ARRIVAL] for row in rows), dtype=np.float64, count=len(rows))
    finish_s = np.fromiter((np.inf if row[_FINISH] is None else row[_FINISH] for row in rows), dtype=np.float64,
                           count=len(rows))
    stopped_s = result.stopped_s
    stability = stability_of(arrival_s, finish_s, start_s, end_s if stopped_s is None else min(end_s, stopped_s),
                             tolerance)
    in_window = np.flatnonzero((arrival_s >= start_s) & (arrival_s < end_s)).tolist()
    measured = pl.from_arrow(requests_to_arrow([rows[i] for i in in_window]))
    check = check_slos(measured, slos)
    if stopped_s is not None and check.meets_slos:  # the watch's reasoning says this cannot be
        raise RuntimeError(f"a simulation stopped at {stopped_s:g} s as certain to miss {watch.missed.key} meets it "
                           "over the part simulated")
    return measured, stability, check, stopped_s


def evaluate_point(library: SessionLibrary, workload: WorkloadParams, slos: Sequence[SLO], job: PointJob,
                   on_request_done=None) -> PointResult:
    """Simulate `job` on its seed's stream and judge it against `slos` and stability. ``on_request_done`` is
    `sim.simulator.simulate`'s (a job run ahead that no search took is stopped from it: analysis.capacity.executors)."""
    duration_s = workload.duration_s(job.qps, job.duration_scale)
    warmup_s = workload.warmup_fraction * duration_s
    try:
        trace, window = steady_trace(library, job.qps, duration_s, warmup_s, workload.think_times, job.seed)
    except EmptyStream:
        # Nothing arrived, so nothing missed an SLO or queued up: judged as the empty window it is (it passes),
        # instead of the empty trace's traceback that ended the sweep.
        empty = pl.from_arrow(requests_to_arrow([]))
        stability = measure_stability(empty, warmup_s, duration_s, workload.stability_tolerance)
        return _point(job, empty, stability, check_slos(empty, slos), slos, duration_s - warmup_s, 0, duration_s,
                      warmup_s, stopped_early=False)
    stopped_early = False
    probe_end_s = PROBE_FRACTION * duration_s
    arrivals_s = trace.requests["arrival_s"]
    if (workload.early_stop and job.probe
            and ((arrivals_s >= workload.warmup_fraction * probe_end_s) & (arrivals_s < probe_end_s)).sum()
            >= PROBE_MIN_REQUESTS):
        probe = trace.head(max(2, int((arrivals_s < probe_end_s).sum())))
        measured, stability, check, _ = _judge(probe, job, slos, workload.warmup_fraction * probe_end_s,
                                               probe_end_s, PROBE_TOLERANCE_FACTOR * workload.stability_tolerance,
                                               on_request_done=on_request_done)
        stopped_early = not stability.stable and not check.meets_slos
        if stopped_early:
            window_s = probe_end_s * (1 - workload.warmup_fraction)
            return _point(job, measured, stability, check, slos, window_s, len(probe), probe_end_s,
                          workload.warmup_fraction * probe_end_s, stopped_early=True)
    measured, stability, check, stopped_s = _judge(trace, job, slos, window.start_s, window.end_s,
                                                   workload.stability_tolerance,
                                                   workload.early_stop and job.certain_miss, on_request_done)
    if stopped_s is not None:  # certain to miss an SLO: judged on the part simulated, as a probe's point is
        arrived = int((trace.requests["arrival_s"] <= stopped_s).sum())
        return _point(job, measured, stability, check, slos, max(stopped_s - window.start_s, 0.0), arrived,
                      stopped_s, warmup_s, stopped_early=True)
    return _point(job, measured, stability, check, slos, window.length_s, len(trace), duration_s, warmup_s,
                  stopped_early=False)


def _point(job: PointJob, measured: pl.DataFrame, stability, check, slos, window_s: float, stream_requests: int,
           stream_duration_s: float, warmup_s: float, stopped_early: bool) -> PointResult:
    summary = summarize(measured, None, duration_s=window_s, vllm_names=False,
                        prefix_caching=job.config.enable_prefix_caching)
    return PointResult(
        qps=job.qps, seed=job.seed, duration_scale=job.duration_scale,
        feasible=check.meets_slos and stability.stable, meets_slos=check.meets_slos, stable=stability.stable,
        stopped_early=stopped_early,
        goodput_rps=None if stopped_early else round_sig(goodput_rps(measured, slos, window_s)),
        slo_values_ms={key: round_sig(value) for key, value in check.values_ms.items()},
        num_requests=measured.height, stream_requests=stream_requests,
        stream_duration_s=round_sig(stream_duration_s), warmup_s=round_sig(warmup_s),
        request_throughput_rps=summary["request_throughput"], output_throughput_tok_s=summary["output_throughput"],
        stability=dataclasses.asdict(stability),
        latency_ms={f"{metric}_ms": dict(summary[f"{metric}_ms"]) for metric in LATENCY_LABELS},
        **{name: summary[name] for name in _SUMMARY_FIELDS},
    )
