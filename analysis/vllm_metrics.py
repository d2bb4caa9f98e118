"""vLLM's flat serving-benchmark names (``mean_ttft_ms``, ``p99_itl_ms``, ``request_throughput``, ...), so a
summary.json reads like the result file of ``vllm bench serve`` beside our nested ``ttft_ms`` statistics.

Computed as vLLM's ``calculate_metrics`` computes them (vllm/benchmarks/serve.py):

- only successful requests count (``completed``): ours are the finished ones ("stop"/"length" and the
  cuts), the same requests our latency statistics time;
- TPOT = (E2E - TTFT) / (output tokens - 1), over requests with more than one output token;
- ITL = every gap between consecutive tokens of those requests, pooled;
- ``std`` is the population standard deviation (numpy's default, ddof=0), ``median`` numpy's median and
  ``p99`` numpy's linear-interpolation percentile;
- throughputs divide the completed requests' requests and tokens by the run's duration.

Where vLLM prints 0 for a statistic without samples (a run where nothing completed), these are null:
a missing number must never read as a measured 0.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from analysis.stats import MS_PER_S, finite_values, percentile, round_sig, sorted_median

# vLLM's metric stem -> our per-request column (ITL has none: it pools every gap).
VLLM_LATENCIES: dict[str, str | None] = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": None, "e2el": "e2e_s"}
VLLM_STATISTICS: tuple[str, ...] = ("mean", "median", "std", "p99")


def _stats_ms(values: np.ndarray, ordered: np.ndarray | None = None) -> dict[str, float | None]:
    """``ordered``: ``values`` sorted, where the caller has them: the same values in ms in the same order (scaling
    keeps it), so the same median and p99, read by index (``sorted_median``, ``percentile``)."""
    if values.size == 0:
        return dict.fromkeys(VLLM_STATISTICS)
    ms = values * MS_PER_S
    mean, std = float(ms.mean()), float(ms.std())  # before the partitions below reorder ``ms``
    if ordered is None:
        # ``ms`` is this function's own: partitioned in place instead of copied twice (the same order statistics,
        # so the same median and p99).
        median = float(np.median(ms, overwrite_input=True))
        p99 = float(np.percentile(ms, 99, overwrite_input=True))
    else:
        median, p99 = sorted_median(ordered, MS_PER_S), percentile(ordered, 99, MS_PER_S)
    return {"mean": round_sig(mean), "median": round_sig(median), "std": round_sig(std), "p99": round_sig(p99)}


def _rate(count: float, duration_s: float) -> float | None:
    return round_sig(count / duration_s) if duration_s > 0 else None


def vllm_flat_metrics(finished: pl.DataFrame, num_requests: int, duration_s: float, itl_s: np.ndarray,
                      sorted_itl_s: np.ndarray | None = None) -> dict:
    """The flat names of one run: ``finished`` holds the finished requests with latency columns,
    ``itl_s`` their pooled gaps between tokens (s) (``sorted_itl_s``: their finite values sorted, if the caller
    has them), ``duration_s`` the run's duration."""
    input_tokens = int(finished["prompt_tokens"].sum())
    output_tokens = int(finished["output_tokens"].sum())
    flat: dict = {
        "completed": finished.height,
        "failed": num_requests - finished.height,
        "duration": round_sig(duration_s),
        "total_input_tokens": input_tokens,
        "request_throughput": _rate(finished.height, duration_s),
        "output_throughput": _rate(output_tokens, duration_s),
        "total_token_throughput": _rate(input_tokens + output_tokens, duration_s),
    }
    for metric, column in VLLM_LATENCIES.items():
        values = finite_values(itl_s if column is None else finished[column])
        for statistic, value in _stats_ms(values, sorted_itl_s if column is None else None).items():
            flat[f"{statistic}_{metric}_ms"] = value
    return flat
