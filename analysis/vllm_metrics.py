"""vLLM's flat serving-benchmark names (``mean_ttft_ms``, ``p99_itl_ms``, ``request_throughput``, ...), so a
summary.json reads like the result file of ``vllm bench serve`` beside our nested ``ttft_ms`` statistics.

Computed as vLLM's ``calculate_metrics`` computes them (vllm/benchmarks/serve.py):

- only successful requests count (``completed``): ours are the finished ones ("stop"/"length" and the
  cuts), the same requests our latency statistics time;
- TPOT = (E2E - TTFT) / (output tokens - 1), over requests with more than one output token;
- ITL = every gap between consecutive tokens of those requests, pooled;
- ``std`` is the population standard deviation (numpy's default, ddof=0), ``median`` numpy's median and
  ``p99`` numpy's linear-interpolation percentile, as are the percentiles chosen as vLLM's
  ``--metric-percentiles`` chooses them (``p99.9_ttft_ms``: each percentile written as vLLM writes its key);
- throughputs divide the completed requests' requests and tokens by the run's duration;
- ``max_concurrent_requests``: the most completed requests in flight at once, each from its arrival to its
  arrival + E2E (a request that ends as another arrives is not counted with it);
- ``max_output_tokens_per_s``: the most output tokens of completed requests in one whole second counted from the
  first completed request's arrival (vLLM's "Peak output token throughput").

Where vLLM prints 0 for a statistic without samples (a run where nothing completed), these are null:
a missing number must never read as a measured 0.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from analysis.stats import MS_PER_S, finite_values, percentile, round_sig, sorted_median

# vLLM's metric stem -> our per-request column (ITL has none: it pools every gap).
VLLM_LATENCIES: dict[str, str | None] = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": None, "e2el": "e2e_s"}
VLLM_STATISTICS: tuple[str, ...] = ("mean", "median", "std")
# vLLM's ``--metric-percentiles`` default.
DEFAULT_METRIC_PERCENTILES: tuple[float, ...] = (99.0,)


def check_metric_percentile(q: float, shown: str) -> float:
    """``q`` when it is a percentile vLLM's ``--metric-percentiles`` takes (a number from 0 to 100); else ValueError
    naming ``shown``, the value as its reader wrote it."""
    if not 0 <= q <= 100:  # NaN too
        raise ValueError(f"{shown} is not a percentile; expected numbers from 0 to 100, such as 25,50,99.9")
    return q + 0.0  # -0 as 0.0: summary.json listed it as -0.0


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """``25,50,99.9`` (vLLM's ``--metric-percentiles`` syntax) as percentiles, repeats dropped; ValueError names the
    item that is not one."""
    percentiles = []
    for item in (part.strip() for part in text.split(",")):
        try:
            q = float(item)
        except ValueError:
            q = math.nan
        percentiles.append(check_metric_percentile(q, repr(item)))
    return tuple(dict.fromkeys(percentiles))


def percentile_name(q: float) -> str:
    """The statistic's name of percentile ``q`` in vLLM's keys: ``p99`` for 99 and 99.0, ``p99.9`` for 99.9."""
    return f"p{int(q)}" if float(q).is_integer() else f"p{q!r}"


def _stats_ms(values: np.ndarray, ordered: np.ndarray | None = None,
              percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES) -> dict[str, float | None]:
    """Mean, median, std and ``percentiles`` of ``values`` in ms. ``ordered``: ``values`` sorted, where the caller has
    them: the same values in ms in the same order (scaling keeps it), so the same median and percentiles, read by
    index (``sorted_median``, ``percentile``)."""
    names = [*VLLM_STATISTICS, *map(percentile_name, percentiles)]
    if values.size == 0:
        return dict.fromkeys(names)
    ms = values * MS_PER_S
    mean, std = float(ms.mean()), float(ms.std())  # before the partitions below reorder ``ms``
    if ordered is None:
        # ``ms`` is this function's own: partitioned in place instead of copied twice (the same order statistics,
        # so the same median and percentiles).
        median = float(np.median(ms, overwrite_input=True))
        points = np.percentile(ms, list(percentiles), overwrite_input=True).tolist() if percentiles else []
    else:
        median = sorted_median(ordered, MS_PER_S)
        points = [percentile(ordered, q, MS_PER_S) for q in percentiles]
    return dict(zip(names, map(round_sig, [mean, median, std, *points])))


def _rate(count: float, duration_s: float) -> float | None:
    return round_sig(count / duration_s) if duration_s > 0 else None


def max_concurrent_requests(finished: pl.DataFrame) -> int | None:
    """The most of ``finished`` (with latency columns) in flight at once, each over [arrival, arrival + E2E): at equal
    times an end comes before an arrival. None without finished requests."""
    if finished.height == 0:
        return None
    starts_s = finished["arrival_s"].to_numpy()
    ends_s = starts_s + finished["e2e_s"].to_numpy()
    times_s = np.concatenate([starts_s, ends_s])
    deltas = np.concatenate([np.ones(starts_s.size, dtype=np.int64), np.full(ends_s.size, -1, dtype=np.int64)])
    order = np.lexsort((deltas, times_s))  # by time, then -1 before +1
    return int(np.cumsum(deltas[order]).max())


def max_output_tokens_per_s(finished: pl.DataFrame) -> float | None:
    """The most token times of ``finished`` in one one-second bucket counted from their first arrival. None without
    finished requests."""
    if finished.height == 0:
        return None
    token_times_s = finished["token_times_s"].explode().drop_nulls().to_numpy()
    if token_times_s.size == 0:
        return 0.0
    # Truncated, as vLLM's int(); never negative: a token comes no earlier than its request's arrival.
    seconds = (token_times_s - finished["arrival_s"].min()).astype(np.int64)
    # One counter a second where the run spans no more seconds than it has tokens (3.4M tokens: 10 ms, sorting them
    # 33 ms); counted by sorting where it spans far more (a trace reaching 1e12 s asked for a 7 TiB counter array).
    if seconds.max() < seconds.size:
        return float(np.bincount(seconds).max())
    return float(np.unique(seconds, return_counts=True)[1].max())


def vllm_flat_metrics(finished: pl.DataFrame, num_requests: int, duration_s: float, itl_s: np.ndarray,
                      sorted_itl_s: np.ndarray | None = None,
                      percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES) -> dict:
    """The flat names of one run: ``finished`` holds the finished requests with latency columns,
    ``itl_s`` their pooled gaps between tokens (s) (``sorted_itl_s``: their finite values sorted, if the caller
    has them), ``duration_s`` the run's duration; ``percentiles``: vLLM's ``--metric-percentiles``."""
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
        "max_concurrent_requests": max_concurrent_requests(finished),
        "max_output_tokens_per_s": max_output_tokens_per_s(finished),
        "metric_percentiles": list(percentiles),
    }
    for metric, column in VLLM_LATENCIES.items():
        values = finite_values(itl_s if column is None else finished[column])
        for statistic, value in _stats_ms(values, sorted_itl_s if column is None else None, percentiles).items():
            flat[f"{statistic}_{metric}_ms"] = value
    return flat
