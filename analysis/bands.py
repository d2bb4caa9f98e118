"""Prediction bands of a simulated run: N seeded replays (``sim.bands``), each summarized like the main run, and
per metric the median and the p5-p95 range over them, for summary.json's ``bands``.

The main run's outputs stay those of the unperturbed replay; the bands only add. Replays run in a local process
pool (spawned, as the capacity sweeps' pool) when there is more than one core; each replay's perturbations
depend on --seed and its index only, so a band is the same however many processes compute it.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping

import polars as pl

from analysis.band_stats import band_of, flat_bands
from analysis.formatting import format_float
from analysis.metrics import summarize
from analysis.process_pools import (
    interrupts_held,
    read_start_up_file,
    remove_start_up_file,
    spawn_pool,
    stop_pool,
    write_start_up_file,
)
from analysis.runs import with_latency_columns
from analysis.slo import SLO
from sim.bands import band_model, band_replay
from sim.config import SimConfig
from sim.simulator import simulate

LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
STATISTICS = ("p50", "p90", "p99", "mean")
SCALARS = ("output_throughput", "request_throughput", "goodput", "duration_s", "num_preemptions",
           "prefix_cache_hit_rate")


def banded_metrics(summary: Mapping) -> dict[str, float]:
    """The figures a band is given for, flat (``ttft_ms.p50``), from one summarize() dict."""
    flat = {}
    for metric in LATENCIES:
        for stat in STATISTICS:
            value = (summary.get(metric) or {}).get(stat)
            if value is not None:
                flat[f"{metric}.{stat}"] = float(value)
    for key in SCALARS:
        if summary.get(key) is not None:
            flat[key] = float(summary[key])
    return flat


def replay_metrics(trace, config: SimConfig, index: int, slos: tuple[SLO, ...] | None) -> dict[str, float]:
    """Band replay ``index``'s figures."""
    replay_config, cost_model = band_replay(config, index)
    result = simulate(trace, replay_config, cost_model=cost_model)
    requests = with_latency_columns(pl.from_arrow(result.requests_table()))
    # No step table: no banded figure reads a step column, and built in every worker at once it took as much memory
    # as the run's own outputs, per worker (the Azure trace's 1.78M steps: ~300 MB each).
    return banded_metrics(summarize(requests, None, slos, prefix_caching=config.enable_prefix_caching))


_WORKER: dict[str, object] = {}


def _init_worker(args_path: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C
    # Born with SIGINT blocked (run_bands): a Ctrl-C that reached it while it started is pending, and now ignored.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    trace, config, slos = read_start_up_file(args_path)
    _WORKER["args"] = (trace, config)
    _WORKER["slos"] = slos


def _replay_in_worker(index: int) -> dict[str, float]:
    trace, config = _WORKER["args"]
    return replay_metrics(trace, config, index, _WORKER["slos"])


def run_bands(trace, config: SimConfig, num_replays: int, *, slos: tuple[SLO, ...] | None = None,
              num_jobs: int = 1, on_replay_done: Callable[[], None] | None = None) -> dict:
    """summary.json's ``bands``: {num_replays, seed, varied, metrics: {ttft_ms: {p50: {median, p5, p95}}, ...,
    output_throughput: {median, p5, p95}, ...}}."""
    shape = config.model_shape
    varied = band_model(config, shape).describe()
    indices = range(num_replays)
    if num_jobs > 1 and num_replays > 1:
        results = []
        # The trace reaches the workers through a file, as the capacity sweep's sessions do: as start-up data (a
        # third of a megabyte for 500 requests) it filled the pipe to a new worker, and a SIGTERM sent to the
        # whole process group (timeout, a supervisor) killed that worker while it imported: this process then
        # wrote forever to the pipe of a worker that had died, and never stopped.
        args_path = write_start_up_file((trace, config, slos), "bands-")
        try:
            pool = spawn_pool(min(num_jobs, num_replays), _init_worker, (args_path,))
            try:
                # Ctrl-C waits until every worker is started and every replay queued: the workers are spawned in
                # here with SIGINT blocked, so that a terminal's Ctrl-C (sent to the whole process group) cannot
                # interrupt one while it imports, which printed its traceback and left this process writing forever
                # to the pipe of a worker that had died.
                with interrupts_held(block_sigint=True):
                    replays = pool.map(_replay_in_worker, indices)
                for metrics in replays:
                    results.append(metrics)
                    if on_replay_done is not None:
                        on_replay_done()
            except BaseException:  # Ctrl-C or a failed replay: stop the others now rather than wait for every one
                stop_pool(pool)
                raise
            pool.shutdown(wait=True)
        finally:  # the workers are gone: stopped, or done
            remove_start_up_file(args_path)
    else:
        results = []
        for i in indices:
            results.append(replay_metrics(trace, config, i, slos))
            if on_replay_done is not None:
                on_replay_done()
    metrics: dict[str, dict] = {}
    for key in results[0]:
        values = [r[key] for r in results if key in r]
        if len(values) < num_replays:  # a figure some replays lack (no finished request) has no band
            continue
        metric, _, stat = key.partition(".")
        if stat:
            metrics.setdefault(metric, {})[stat] = band_of(values)
        else:
            metrics[metric] = band_of(values)
    return {"num_replays": num_replays, "seed": config.seed, "varied": varied, "metrics": metrics}


def format_bands(bands: Mapping) -> str:
    """The bands as a fixed-width text block for the CLI."""
    lines = [f"prediction bands over {bands['num_replays']} seeded replays (median [p5 - p95]):"]
    for key, band in flat_bands({"bands": bands}).items():
        median, p5, p95 = (format_float(float(band[stat])) for stat in ("median", "p5", "p95"))
        lines.append(f"  {key:<28}{median:>12}   [{p5} - {p95}]")
    lines += [f"  varied: {what}: {how}" for what, how in bands["varied"].items()]
    return "\n".join(lines)
