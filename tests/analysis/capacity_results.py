"""Hand-made capacity results for tests of what is computed and drawn from them."""

from __future__ import annotations

import dataclasses

from analysis.capacity.bisection import SearchOutcome
from analysis.capacity.point import PointResult
from analysis.capacity.sweep import ConfigResult, SeedSearch
from sim.config import SimConfig


def point_result(qps: float, ttft_p90_ms: float, total_output_tokens: int = 60_000,
                 num_requests: int = 200) -> PointResult:
    return PointResult(
        qps=qps, seed=0, duration_scale=1.0, feasible=True, meets_slos=True, stable=True, stopped_early=False,
        goodput_rps=qps, slo_values_ms={"ttft_p90": ttft_p90_ms}, num_requests=num_requests,
        num_finished=num_requests, num_rejected=0, stream_requests=2 * num_requests, stream_duration_s=100.0,
        warmup_s=25.0, request_throughput_rps=qps, output_throughput_tok_s=None,
        total_output_tokens=total_output_tokens, prefix_cache_hit_rate=0.0, num_preemptions=0,
    )


def config_result(index: int, config: SimConfig, max_qps: float | None, ttft_p90_ms: float = 100.0,
                  bound: bool = False) -> ConfigResult:
    """A converged answer at max_qps (a failure 1 % above it), confirmed on a stream twice as long, or with `bound`
    a lower bound (nothing failed)."""
    points = (point_result(max_qps, ttft_p90_ms),) if max_qps is not None else (point_result(1.0, 1e4),)
    verdicts = tuple((p.qps, max_qps is not None) for p in points)
    if max_qps is not None and not bound:
        verdicts += ((max_qps * 1.01, False),)
    outcome = SearchOutcome(max_qps=max_qps, points=verdicts, converged=not bound, monotone=True)
    checks = (dataclasses.replace(points[0], duration_scale=2.0),) if max_qps is not None and not bound else ()
    return ConfigResult(index, config, f"c{index}", (SeedSearch(0, outcome, points, checks),))
