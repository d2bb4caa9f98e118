"""Serving metrics of one replay, defined as in vLLM's serving benchmark.

Simulated and GPU replays both go through these functions, so a sim-vs-real
comparison only ever differs in its inputs, never in how a metric is computed.

Definitions (all per request, in seconds):
- TTFT  = first_token_s - arrival_s
- E2E   = finish_s - arrival_s for finished requests ("stop"/"length"), else the
          last token time - arrival_s (null without tokens)
- TPOT  = (E2E - TTFT) / (output_tokens - 1), null for outputs of one token or less
- queue = first_scheduled_s - arrival_s
- ITL   = every gap between consecutive token times, pooled over requests
All are null for rejected requests. Like vLLM, the latency distributions of a
summary cover finished requests only; aborted ones are counted but not timed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import numpy as np
import polars as pl
import pyarrow as pa

from analysis.formatting import LATENCY_LABELS
from analysis.schema import (
    ABORTED,
    CUT_REASONS,
    FAILED,
    FINISHED_REASONS,
    REJECTED,
    REQUESTS_SCHEMA,
    conform_requests,
    conform_steps,
)
from analysis.slo import SLO, statistic_of
from analysis.stats import MS_PER_S, latency_stats, round_sig, scaled_stats
from analysis.vllm_metrics import DEFAULT_METRIC_PERCENTILES, vllm_flat_metrics
from sim.run_kind import CLIENT_TIMING  # re-exported: traces.bench and analysis.vllm_import write it

# Per-request latency columns (s) that `add_latency_columns` adds; ITL has none (it pools gaps).
LATENCY_COLUMNS: tuple[str, ...] = ("ttft_s", "tpot_s", "e2e_s", "queue_s")

_LATENCY_INPUTS = (
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "output_tokens",
    "finish_reason",
    "token_times_s",
)
_SUMMARY_REQUEST_INPUTS = tuple(column for column in REQUESTS_SCHEMA if column not in ("request_id", "replica"))
# The step columns a summary reads.
SUMMARY_STEP_INPUTS: tuple[str, ...] = ("duration_s", "kv_usage")
# Metrics of the gaps between tokens: a request with one output token has none, so cannot miss their SLOs.
_GAP_METRICS = ("tpot", "itl")


def is_finished() -> pl.Expr:
    """Per request: it finished ("stop" or "length"); never null. Only these are timed in summaries."""
    return pl.col("finish_reason").is_in(FINISHED_REASONS).fill_null(False)


def _is_rejected() -> pl.Expr:
    return (pl.col("finish_reason") == REJECTED).fill_null(False)


def add_latency_columns(requests: pl.DataFrame) -> pl.DataFrame:
    """Return `requests` with `ttft_s`, `tpot_s`, `e2e_s`, `queue_s` added (seconds).

    Kept as columns (not only aggregates) so callers can plot them, filter them
    or check SLOs per request.
    """
    frame = conform_requests(requests, _LATENCY_INPUTS)
    admitted = ~_is_rejected()
    arrival = pl.col("arrival_s")
    last_token_s = pl.col("token_times_s").list.last()
    end_s = pl.when(is_finished()).then(pl.col("finish_s")).otherwise(last_token_s)
    frame = frame.with_columns(
        pl.when(admitted).then(pl.col("first_token_s") - arrival).alias("ttft_s"),
        pl.when(admitted).then(end_s - arrival).alias("e2e_s"),
        pl.when(admitted).then(pl.col("first_scheduled_s") - arrival).alias("queue_s"),
    )
    num_gaps = pl.col("output_tokens") - 1
    return frame.with_columns(
        pl.when(num_gaps > 0)
        .then((pl.col("e2e_s") - pl.col("ttft_s")) / num_gaps.cast(pl.Float64))
        .alias("tpot_s")
    )


def itl_values(requests: pl.DataFrame) -> np.ndarray:
    """Inter-token latencies (s) of all rows, pooled: each gap between consecutive tokens."""
    token_times = conform_requests(requests, ["token_times_s"])["token_times_s"]
    lists = token_times.to_arrow()
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = None
    if not lists.null_count and isinstance(lists, (pa.ListArray, pa.LargeListArray)):
        # Every token time, list after list, and each list's length, read from the offsets: flatten() and
        # value_lengths() import pyarrow.compute, 0.03 CPU s that a replay spent on nothing else.
        offsets = lists.offsets.to_numpy()
        values = lists.values.slice(offsets[0], offsets[-1] - offsets[0])
        lengths = np.diff(offsets)
    else:
        values = lists.flatten()  # every token time, list after list (null lists hold none)
    if values.null_count or not pa.types.is_floating(values.type):
        return _itl_values_per_list(token_times)
    # One difference over all the times, less the ones that span two lists: the same subtractions as per list, at
    # a tenth of the cost (an hour of the Azure trace pools 4.6M gaps, and a summary and its report each pool them).
    times = values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
    if lengths is None:
        lengths = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    starts = np.cumsum(lengths) - lengths
    gaps = np.diff(times)
    keep = np.ones(gaps.size, dtype=bool)
    keep[starts[(lengths > 0) & (starts > 0)] - 1] = False  # the gap from a list's last time to the next one's first
    return gaps[keep]


def _itl_values_per_list(token_times: pl.Series) -> np.ndarray:
    """``itl_values`` list by list, for lists that hold nulls: a gap next to a null is none."""
    # `list.diff` leaves a null first element (and `explode` a null for empty lists).
    return token_times.list.diff().explode().drop_nulls().to_numpy().astype(np.float64, copy=False)


def makespan_s(requests: pl.DataFrame) -> float:
    """Time from the first arrival to the last finish or token: the run's duration."""
    frame = conform_requests(requests, ["arrival_s", "finish_s", "token_times_s"])
    if frame.height == 0:
        return 0.0
    bounds = frame.select(
        pl.col("arrival_s").min().alias("start"),
        pl.max_horizontal(pl.col("finish_s").max(), pl.col("token_times_s").list.max().max()).alias("end"),
    ).row(0)
    start, end = bounds
    if start is None or end is None:
        return 0.0
    return max(0.0, float(end) - float(start))


def latency_column(metric: str) -> str | None:
    """The per-request column (s) of a metric of `LATENCY_LABELS`; None for ITL."""
    column = f"{metric}_s"
    return column if column in LATENCY_COLUMNS else None


def latency_samples_s(requests: pl.DataFrame, metric: str) -> pl.Series | np.ndarray:
    """The values of `metric` over `requests` (s, with latency columns): its column, or ITL's pooled gaps."""
    column = latency_column(metric)
    return itl_values(requests) if column is None else requests[column]


def _per_request_itl_s(requests: pl.DataFrame, statistic: str) -> pl.Series:
    """Each request's own ITL statistic (s); null with fewer than two tokens."""
    values = [
        statistic_of(np.diff(np.asarray(times, dtype=np.float64)), statistic) if times is not None else None
        for times in requests["token_times_s"].to_list()
    ]
    return pl.Series("itl_s", values, dtype=pl.Float64)


def requests_meeting_slos(requests: pl.DataFrame, slos: Iterable[SLO]) -> pl.Series:
    """Per request: finished and within every SLO limit (vLLM's goodput criterion), never null.

    Each request is held to its own value, so the SLO's statistic only matters for ITL (the
    statistic of the request's own gaps); two SLOs on one metric (``ttft_p50=1s,ttft_p99=3s``) thus
    apply the stricter limit. Rejected and aborted requests never meet. A request with a single
    output token has no TPOT (nor ITL) and so cannot violate such an SLO (vLLM counts it as 0).
    """
    return _meeting_slos(add_latency_columns(requests), slos)


def _meeting_slos(frame: pl.DataFrame, slos: Iterable[SLO]) -> pl.Series:
    """``requests_meeting_slos`` of a frame that has its latency columns already."""
    passes = is_finished()
    for slo in slos:
        column = latency_column(slo.metric)
        if column is None:  # ITL: the SLO's statistic of the request's own gaps
            column = f"__itl_{slo.statistic}_s"
            frame = frame.with_columns(_per_request_itl_s(frame, slo.statistic).alias(column))
        within = pl.col(column) <= slo.limit_s
        if slo.metric in _GAP_METRICS:
            within = within | pl.col(column).is_null()
        passes = passes & within.fill_null(False)
    return frame.select(passes.alias("meets_slos")).to_series()


def _unmeasured_slo_metrics(frame: pl.DataFrame, slos: Iterable[SLO]) -> list[str]:
    """The metrics of `slos` that some finished request of ``frame`` (its latency columns added) has no value of
    although it should (a run served over HTTP or imported records no queue time): such a request cannot be judged,
    so neither can the run's goodput."""
    finished = frame.filter(is_finished())
    columns = {slo.metric: latency_column(slo.metric) for slo in slos if slo.metric not in _GAP_METRICS}
    return [metric for metric, column in columns.items() if column is not None and finished[column].null_count()]


def goodput_rps(requests: pl.DataFrame, slos: Iterable[SLO], duration_s: float | None = None) -> float | None:
    """Requests per second that finished within every SLO (vLLM's goodput), over `duration_s`
    (default: the replay's makespan). None when a finished request lacks a value an SLO limits
    (`_unmeasured_slo_metrics`): every request then failed that SLO, and the goodput read as a measured 0."""
    slos = tuple(slos)
    frame = add_latency_columns(requests)  # once, for both questions
    if _unmeasured_slo_metrics(frame, slos):
        return None
    duration_s = makespan_s(requests) if duration_s is None else duration_s
    if duration_s <= 0:
        return 0.0
    return float(_meeting_slos(frame, slos).sum()) / duration_s


_DIGITS = re.compile(r"(\d+)")


def grouped_reasons(counts: Mapping[str, int]) -> dict[str, int]:
    """Reasons that differ only in their numbers counted as one, each varying number shown as its range.

    A rejection names the request's own size ("prompt has 41002 tokens, more than max_model_len=40960"), so a trace
    with hundreds of over-long prompts summarised as hundreds of reasons of one request each (561 on the Mooncake
    trace), which the summary table could not show: now "prompt has 40992 to 126195 tokens, more than
    max_model_len=40960": 561. A number that every member shares stays as it is, and one message stays itself. Largest
    count first. Numbers are compared as digit strings (by length, then text), never parsed: a reason from a server
    may hold any number of digits.
    """
    groups: dict[tuple[str, ...], list] = {}  # the text between numbers -> [count, [lowest, highest] per number]
    for reason, count in counts.items():
        parts = _DIGITS.split(reason)  # text, number, text, ..., text
        numbers = [(len(digits.lstrip("0")), digits.lstrip("0"), digits) for digits in parts[1::2]]
        group = groups.get(texts := tuple(parts[0::2]))
        if group is None:
            groups[texts] = [count, [[number, number] for number in numbers]]
            continue
        group[0] += count
        for span, number in zip(group[1], numbers, strict=True):
            span[0], span[1] = min(span[0], number), max(span[1], number)
    merged = {}
    for texts, (count, spans) in groups.items():
        shown = [low[2] if low[:2] == high[:2] else f"{low[2]} to {high[2]}" for low, high in spans]
        merged["".join(part for pair in zip(texts, [*shown, ""]) for part in pair)] = count
    return dict(sorted(merged.items(), key=lambda item: (-item[1], item[0])))


def _kv_usage(steps: pl.DataFrame) -> tuple[float | None, float | None]:
    """Peak and duration-weighted mean KV usage; None without steps."""
    if steps.height == 0:
        return None, None
    peak, weighted, busy_s, plain_mean = steps.select(
        pl.col("kv_usage").max().alias("peak"),
        (pl.col("kv_usage") * pl.col("duration_s")).sum().alias("weighted"),
        pl.col("duration_s").sum().alias("busy_s"),
        pl.col("kv_usage").mean().alias("plain_mean"),
    ).row(0)
    mean = weighted / busy_s if busy_s and busy_s > 0 else plain_mean
    return peak, mean


def is_timed_by_client(meta: dict) -> bool:
    """Whether a run's summary meta says it was measured from outside the engine: it has no step log however its
    requests ended (its tables alone cannot say so when no request got a token)."""
    return CLIENT_TIMING in str(meta.get("cost_model") or "")


def has_step_log(requests: pl.DataFrame, steps: pl.DataFrame | None) -> bool:
    """Whether the run logged its engine steps: a run that served tokens without a single step row was
    measured from outside the engine (over HTTP, or imported from another tool), so its step count and
    schedule are unknown, not 0."""
    if steps is not None and steps.height > 0:
        return True
    return requests.height == 0 or requests["first_token_s"].null_count() == requests.height


def _rate(count: float, duration_s: float) -> float | None:
    return round_sig(count / duration_s) if duration_s > 0 else None


def _known_sum(column: pl.Series) -> int | None:
    """The column's sum, or None when any value is unknown (a client over HTTP cannot see cached tokens or
    preemptions: their totals are missing, never 0)."""
    return None if column.null_count() else int(column.sum())


def caches_prefixes(config: Mapping | None) -> bool:
    """Whether a run ran with a prefix cache, as its summary.json's config records it: False only where it says
    ``enable_prefix_caching`` false (--no-prefix-caching); a config that does not say (a run timed over HTTP, a
    hand-made folder) leaves its cached tokens to say whether they are known."""
    return not isinstance(config, Mapping) or config.get("enable_prefix_caching") is not False


def _hit_rate(cached_tokens: int | None, prompt_tokens: int, prefix_caching: bool) -> float | None:
    """The admitted prompt tokens' share found in the prefix cache; None when unknown, when no prompt token was
    admitted (every request rejected): 0.0 there read as a cache that missed, not as one never asked, or when the
    run had no prefix cache (a rate of a cache that is not there is undefined: vLLM reports none)."""
    if cached_tokens is None or prompt_tokens == 0 or not prefix_caching:
        return None
    return round_sig(cached_tokens / prompt_tokens)


def summarize(
    requests: pl.DataFrame,
    steps: pl.DataFrame | None,
    slos: Iterable[SLO] | None = None,
    duration_s: float | None = None,
    timed_by_client: bool = False,
    vllm_names: bool = True,
    itl_s: np.ndarray | None = None,
    sorted_itl_s: np.ndarray | None = None,
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES,
    prefix_caching: bool = True,
) -> dict:
    """One JSON-ready dict of a replay's headline metrics (see the module docstring), with vLLM's flat
    names beside ours (`analysis.vllm_metrics`) unless `vllm_names` is False (a capacity point reads ours only;
    the flat names' statistics, over every token gap again, were ~2 % of a capacity sweep's CPU time).

    Latencies are in ms as {p50, p90, p99, mean}; statistics with no data are
    None. With `slos`, `goodput` (req/s, also under vLLM's name `request_goodput`; None where the run did not
    record a metric they limit, `goodput_rps`, or where no time passed, as the throughputs) and the limits used
    (`slos_ms`) are added. `duration_s` replaces
    the makespan where the run recorded its own duration but not its arrival times (an imported `vllm bench serve`
    result). `itl_s`: `itl_values` of the finished requests, where the caller has them already (a report draws
    them too); `sorted_itl_s`: their finite values sorted, where the caller sorted them (a report's CDF does): the
    same percentiles from a sorted array's cheaper partitions, the means still summed over `itl_s` in its own order
    (a sum's rounding depends on it). `metric_percentiles`: the percentiles of the flat names (vLLM's
    `--metric-percentiles`, `p99.9_ttft_ms`). `prefix_caching`: whether the run had a prefix cache
    (`caches_prefixes`); without one its hit rate is None.
    """
    frame = add_latency_columns(conform_requests(requests, _SUMMARY_REQUEST_INPUTS))
    step_frame = conform_steps(steps, SUMMARY_STEP_INPUTS)
    finished = frame.filter(is_finished())
    admitted = frame.filter(~_is_rejected())
    duration_s = makespan_s(frame) if duration_s is None else duration_s

    total_output_tokens = int(admitted["output_tokens"].sum())
    total_prompt_tokens = int(admitted["prompt_tokens"].sum())
    total_cached_tokens = _known_sum(admitted["cached_tokens"])
    rejected = frame.filter(_is_rejected())
    reject_reasons = grouped_reasons({
        (str(reason) if reason is not None else "unknown"): int(count)
        for reason, count in rejected.group_by("reject_reason").len().iter_rows()
    })
    peak_kv, mean_kv = _kv_usage(step_frame)

    summary: dict = {
        "num_requests": frame.height,
        "num_finished": finished.height,
        "num_rejected": rejected.height,
        "num_aborted": int((frame["finish_reason"] == ABORTED).sum()),
        "num_failed": int((frame["finish_reason"] == FAILED).sum()),
        # Finished, but before max_tokens: an engine limit (max_model_len, the KV cache, ...) cut them.
        "num_cut": int(frame["finish_reason"].is_in(CUT_REASONS).sum()),
        "finish_reasons": {
            str(reason): int(count)
            for reason, count in frame.group_by("finish_reason").len().sort("finish_reason").iter_rows()
            if reason is not None
        },
        "reject_reasons": reject_reasons,
        "duration_s": round_sig(duration_s),
        "request_throughput": _rate(finished.height, duration_s),
        # vLLM's definition: the finished requests' tokens (an aborted request's partial output is not served)
        "output_throughput": _rate(int(finished["output_tokens"].sum()), duration_s),
        "total_prompt_tokens": total_prompt_tokens,
        "total_output_tokens": total_output_tokens,
        "total_cached_tokens": total_cached_tokens,
    }
    itl_s = itl_values(finished) if itl_s is None else itl_s
    for metric in LATENCY_LABELS:
        samples = itl_s if metric == "itl" else latency_samples_s(finished, metric)
        ordered = sorted_itl_s if metric == "itl" else None
        summary[f"{metric}_ms"] = scaled_stats(latency_stats(samples, ordered), MS_PER_S)
    summary.update(
        {
            "num_preemptions": _known_sum(frame["num_preemptions"]),
            "prefix_cache_hit_rate": _hit_rate(total_cached_tokens, total_prompt_tokens, prefix_caching),
            "peak_kv_usage": round_sig(peak_kv),
            "mean_kv_usage": round_sig(mean_kv),
            # Unknown, not 0, for a run timed by a client (`timed_by_client`), whose requests may all have failed.
            "num_steps": step_frame.height if not timed_by_client and has_step_log(frame, step_frame) else None,
        }
    )
    if vllm_names:
        summary.update(vllm_flat_metrics(finished, frame.height, duration_s, itl_s, sorted_itl_s, metric_percentiles))
        summary["request_goodput"] = None  # as vLLM writes it without SLOs
    if slos is not None:
        slos = tuple(slos)
        # A rate over no time is none, as request_throughput's: a run of one rejected request read "request
        # throughput -" and "goodput 0.000 req/s", a measured rate the run never had.
        summary["goodput"] = round_sig(goodput_rps(frame, slos, duration_s)) if duration_s > 0 else None
        if vllm_names:
            summary["request_goodput"] = summary["goodput"]
        summary["slos_ms"] = {slo.key: slo.limit_ms for slo in slos}
    return summary
