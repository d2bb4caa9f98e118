"""Whether a replay reached a steady state it can hold: the second half of a capacity verdict.

A load can meet latency SLOs over a finite run and still be more than the system serves: the
queue grows all the time, and the percentiles pass only because the run started empty and ended
before the queue got long. Over the measured window [start_s, end_s) of arrivals:

- completion ratio: requests that finished (or were turned away) in the window / requests that
  arrived in it. A system that keeps up completes what arrives: the ratio is ~1.
- backlog: requests arrived and not yet finished, sampled at evenly spaced times of the window;
  its least-squares slope (requests/s) is how fast work piles up. Reported relative to the arrival
  rate: an overload of x % makes it grow at ~x % of the arrival rate.

A replay is stable when the completion ratio is at least 1 - tolerance and the backlog grows by at
most tolerance x the arrival rate. A shortfall or growth of fewer than `NOISE_REQUESTS` requests over
the whole window is never called unstable: a short, lightly loaded stream (a test's) would otherwise
be judged on a handful of requests. The figures are reported with every point, pass or fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analysis.stats import round_sig

DEFAULT_STABILITY_TOLERANCE = 0.03
NUM_BACKLOG_SAMPLES = 24
NOISE_REQUESTS = 10


@dataclass(frozen=True)
class Stability:
    """Stability figures over one measured window (see the module docstring)."""

    window_start_s: float
    window_end_s: float
    num_arrived: int
    num_completed: int
    completion_ratio: float | None
    backlog_start: float  # mean backlog over the window's first quarter
    backlog_end: float  # ... and its last quarter
    backlog_growth_rps: float
    backlog_growth_fraction: float | None  # growth / arrival rate
    stable: bool


def measure_stability(requests: pl.DataFrame, start_s: float, end_s: float, tolerance: float) -> Stability:
    """Stability of a replay's requests (columns arrival_s, finish_s) over arrivals in [start_s, end_s)."""
    arrival = requests["arrival_s"].to_numpy().astype(np.float64)
    # A request without a finish time never left the system (none does after a complete replay).
    finish = requests["finish_s"].fill_null(np.inf).to_numpy().astype(np.float64)
    return stability_of(arrival, finish, start_s, end_s, tolerance)


def stability_of(arrival: np.ndarray, finish: np.ndarray, start_s: float, end_s: float,
                 tolerance: float) -> Stability:
    """`measure_stability` of the requests' arrival and finish times (s, float64; inf: never finished), where the
    caller has them as arrays (a capacity point reads them off the simulator's rows, without a table of them)."""
    in_window = (arrival >= start_s) & (arrival < end_s)
    num_arrived = int(in_window.sum())
    num_completed = int(((finish >= start_s) & (finish < end_s)).sum())
    times = np.linspace(start_s, end_s, NUM_BACKLOG_SAMPLES, endpoint=False)
    arrival_sorted, finish_sorted = np.sort(arrival), np.sort(finish)
    backlog = (np.searchsorted(arrival_sorted, times, side="right")
               - np.searchsorted(finish_sorted, times, side="right")).astype(np.float64)
    slope = float(np.polyfit(times, backlog, 1)[0]) if end_s > start_s else 0.0
    quarter = max(1, NUM_BACKLOG_SAMPLES // 4)
    length_s = end_s - start_s
    arrival_rps = num_arrived / length_s if length_s > 0 else 0.0
    ratio = num_completed / num_arrived if num_arrived else None
    growth = slope / arrival_rps if arrival_rps > 0 else None
    shortfall_ok = ratio is None or ratio >= 1 - tolerance or num_arrived - num_completed < NOISE_REQUESTS
    growth_ok = growth is None or growth <= tolerance or slope * length_s < NOISE_REQUESTS
    stable = shortfall_ok and growth_ok
    return Stability(
        window_start_s=round_sig(start_s), window_end_s=round_sig(end_s), num_arrived=num_arrived,
        num_completed=num_completed, completion_ratio=round_sig(ratio),
        backlog_start=round_sig(float(backlog[:quarter].mean())),
        backlog_end=round_sig(float(backlog[-quarter:].mean())),
        backlog_growth_rps=round_sig(slope), backlog_growth_fraction=round_sig(growth), stable=bool(stable),
    )
