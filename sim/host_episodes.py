"""The host's slow episodes as serving runs showed them, for the profile's ``serving.host_episodes`` (written by
``python -m sim.calibrate``, read by ``sim.bands``).

Per window of ``window_s`` of each run: the median of real / grid-predicted time of its host-bound eager steps
(as ``sim.host_speed.timeline_from_run`` reads a timeline). A run's normal speed is the median over its faster
half of windows; a window more than SLOW_WINDOW times slower than that is slow. Recorded: how much slower the slow
windows run (median over runs), the range of the share of slow windows over the runs, and the mean length of a
run of consecutive slow windows.
"""

from __future__ import annotations

import numpy as np

from sim.host_speed import SLOW_WINDOW

MIN_WINDOWS = 10  # a run with fewer usable windows says nothing about episodes
MIN_STEPS_PER_WINDOW = 3


def run_windows(steps: list[tuple[float, float, float]], window_s: float,
                min_steps: int = MIN_STEPS_PER_WINDOW) -> dict[int, float]:
    """{window index: median slowdown} from (real_s, floor_s, start_s) of a run's host-bound eager steps; windows
    with fewer than ``min_steps`` of them are left out."""
    by_window: dict[int, list[float]] = {}
    for real, floor, start in steps:
        by_window.setdefault(int(start // window_s), []).append(real / floor)
    return {w: float(np.median(v)) for w, v in sorted(by_window.items()) if len(v) >= min_steps}


def fit_host_episodes(runs: list[list[tuple[float, float, float]]], window_s: float = 2.0) -> dict | None:
    """``serving.host_episodes`` from each run's host-bound eager steps (real_s, floor_s, start_s); None when no
    run has MIN_WINDOWS usable windows."""
    shares, ratios, lengths_s, num_windows = [], [], [], 0
    for steps in runs:
        windows = run_windows(steps, window_s)
        if len(windows) < MIN_WINDOWS:
            continue
        values = np.array(list(windows.values()))
        normal = float(np.median(values[values <= np.median(values)]))
        if not normal > 0:
            # Most windows' host-bound steps took no time beyond their grid device time (a host part of 0 s): the run
            # has no normal speed to measure slow windows against. Its slow ones were divided by 0, a
            # ZeroDivisionError traceback from sim.calibrate after all the runs were read.
            continue
        slow = {w for w, v in windows.items() if v > SLOW_WINDOW * normal}
        shares.append(len(slow) / len(windows))
        num_windows += len(windows)
        if slow:
            ratios.append(float(np.median([windows[w] for w in slow])) / normal)
        length, previous = 0, None
        for w in sorted(windows):  # consecutive slow windows (by index) make one episode
            if w in slow:
                if length and previous == w - 1:
                    length += 1
                else:
                    if length:
                        lengths_s.append(length * window_s)
                    length = 1
            elif length:
                lengths_s.append(length * window_s)
                length = 0
            previous = w
        if length:
            lengths_s.append(length * window_s)
    if not shares:
        return None
    return {
        "slow_over_normal": round(float(np.median(ratios)), 4) if ratios else 1.0,
        "slow_share_range": [round(min(shares), 4), round(max(shares), 4)],
        "mean_episode_s": round(float(np.mean(lengths_s)), 3) if lengths_s else window_s,
        "window_s": window_s,
        "num_windows": num_windows,
        "slow_window": SLOW_WINDOW,
    }
