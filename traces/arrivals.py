"""Arrival processes: Poisson, or gamma renewal processes whose burstiness is set by a CV.

A gamma inter-arrival gap with shape k = 1/CV^2 and mean 1/rate has coefficient of
variation CV: CV = 1 is a Poisson process, CV > 1 is burstier, CV < 1 more regular and
CV = 0 a fixed gap. The same gamma family is used for think times between chat turns.
"""

from __future__ import annotations

import math

import numpy as np


def gamma_gaps_s(num: int, mean_s: float, cv: float, rng: np.random.Generator,
                 cv_name: str = "coefficient of variation") -> np.ndarray:
    """`num` positive gaps with the given mean and coefficient of variation; ``cv_name`` names ``cv`` in errors (the
    option that set it: a CV too large for a gamma gap was refused without saying which of a command's CVs it was)."""
    if not 0 < mean_s < math.inf:
        raise ValueError(f"mean gap must be a finite number of seconds > 0, got {mean_s}")
    if not 0 <= cv < math.inf:
        raise ValueError(f"{cv_name} must be a finite number >= 0, got {cv}")
    if cv == 0:
        return np.full(num, mean_s, dtype=np.float64)
    if cv == 1:
        return rng.exponential(mean_s, size=num)
    if cv * cv == 0:  # cv below ~1e-154: the gaps are fixed to double precision
        return np.full(num, mean_s, dtype=np.float64)
    shape = 1.0 / (cv * cv)
    scale = mean_s / shape if shape > 0 else math.inf
    if not scale < math.inf:
        raise ValueError(f"{cv_name} {cv} is too large (a gamma gap of mean {mean_s} s with that coefficient of "
                         "variation overflows)")
    return rng.gamma(shape, scale, size=num)


def arrival_times_s(num: int, rate_per_s: float, cv: float, rng: np.random.Generator,
                    cv_name: str = "coefficient of variation") -> np.ndarray:
    """`num` non-decreasing arrival times starting at 0 with mean rate `rate_per_s`."""
    if not 0 < rate_per_s < math.inf or not 1.0 / rate_per_s < math.inf:
        raise ValueError(f"arrival rate must be a finite number > 0 (and above 1e-308) per second, got {rate_per_s}")
    gaps = gamma_gaps_s(max(num - 1, 0), 1.0 / rate_per_s, cv, rng, cv_name)
    return np.concatenate([[0.0], np.cumsum(gaps)])[:num]
