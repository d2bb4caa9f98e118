"""The HTML report of one replay (simulated or on a GPU): summary tables plus charts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import polars as pl

from analysis.formatting import LATENCY_LABELS, SERVICE_LATENCIES
from analysis.metrics import add_latency_columns, is_finished, latency_samples_s
from analysis.report.figures import Series, histogram_figure, latency_cdf_figure, timeseries_figure
from analysis.report.html_page import html_text, write_html
from analysis.report.limits_section import limits_section_html
from analysis.report.summary_table import summary_table_html
from analysis.schema import conform_requests, conform_steps
from analysis.stats import MS_PER_S

# The latency metrics drawn as CDFs (queue time is in the summary table only).
# Step panels, y-axis title -> (steps column, scale), drawn by this report and by the comparison's.
QUEUE_PANELS: dict[str, tuple[str, float]] = {
    "running sequences": ("num_running", 1.0),
    "waiting sequences": ("num_waiting", 1.0),
}
KV_PANELS: dict[str, tuple[str, float]] = {"KV cache usage (%)": ("kv_usage", 100.0)}
TOKEN_PANELS: dict[str, tuple[str, float]] = {
    "prefill tokens per step": ("num_prefill_tokens", 1.0),
    "decode sequences per step": ("num_decode_seqs", 1.0),
    "step duration (ms)": ("duration_s", MS_PER_S),
}

CHART_TITLES: dict[str, str] = {
    "latency_cdf": "Latency CDFs (finished requests)",
    "latency_by_arrival": "TTFT and TPOT by arrival time",
    "queues": "Running and waiting sequences",
    "kv_usage": "KV cache usage",
    "tokens_per_step": "Tokens per step",
    "batch_histogram": "Batch size distribution",
}


def replica_series(frame: pl.DataFrame, x: str, y: str, scale: float = 1.0, prefix: str = "") -> list[Series]:
    """One `Series` per replica of `frame` (sorted by `x`), named "replica N", y multiplied by `scale`.

    Keeping the name per replica (not per column) gives a replica the same colour on every panel.
    """
    data = frame.select("replica", x, y).drop_nulls()
    replicas, xs = data["replica"].to_numpy(), data[x].to_numpy()
    if not _strictly_sorted(replicas, xs):  # a step log is already sorted: its sort and group-by cost the most
        data = data.sort("replica", x)
        replicas, xs = data["replica"].to_numpy(), data[x].to_numpy()
    ys = data[y].to_numpy()
    bounds = [0, *(np.flatnonzero(replicas[1:] != replicas[:-1]) + 1).tolist(), len(replicas)]
    return [
        Series(name=f"{prefix}replica {replicas[start]}", x=xs[start:end].astype(np.float64),
               y=ys[start:end].astype(np.float64) * scale)
        for start, end in zip(bounds, bounds[1:])
        if end > start
    ]


def _strictly_sorted(replicas: np.ndarray, x: np.ndarray) -> bool:
    """Whether rows are ordered by replica, then by strictly increasing x (ties: a sort may reorder them)."""
    if len(x) < 2:
        return True
    return bool(np.all((replicas[1:] > replicas[:-1]) | ((replicas[1:] == replicas[:-1]) & (x[1:] > x[:-1]))))


def latency_samples_ms(finished: pl.DataFrame) -> dict[str, object]:
    """{label: values in ms} of each of `SERVICE_LATENCIES` over `finished` requests (with latency columns)."""
    return {LATENCY_LABELS[metric]: latency_samples_s(finished, metric) * MS_PER_S for metric in SERVICE_LATENCIES}


def report_figures(requests: pl.DataFrame, steps: pl.DataFrame | None) -> list[go.Figure]:
    """The standard charts of one replay, in page order (titles in `CHART_TITLES`)."""
    latencies = add_latency_columns(conform_requests(requests, ["replica", "arrival_s"]))
    step_frame = conform_steps(steps)
    cdfs = latency_cdf_figure(latency_samples_ms(latencies.filter(is_finished())), title=CHART_TITLES["latency_cdf"])
    by_arrival = timeseries_figure(
        {
            "TTFT (ms)": replica_series(latencies, "arrival_s", "ttft_s", MS_PER_S),
            "TPOT (ms)": replica_series(latencies, "arrival_s", "tpot_s", MS_PER_S),
        },
        title=CHART_TITLES["latency_by_arrival"],
        x_title="arrival time (s)",
        mode="markers",
    )
    step_panels = [
        timeseries_figure(
            {y_title: replica_series(step_frame, "start_s", column, scale)
             for y_title, (column, scale) in panels.items()},
            title=CHART_TITLES[name],
            x_title="step start time (s)",
        )
        for name, panels in (("queues", QUEUE_PANELS), ("kv_usage", KV_PANELS), ("tokens_per_step", TOKEN_PANELS))
    ]
    batch_histogram = histogram_figure(
        {
            "batched tokens per step (tokens)": {"all replicas": step_frame["num_batched_tokens"]},
            "sequences per step (seqs)": {"all replicas": step_frame["num_seqs"]},
        },
        title=CHART_TITLES["batch_histogram"],
        y_title="steps",
    )
    return [cdfs, by_arrival, *step_panels, batch_histogram]


def write_report(
    requests: pl.DataFrame,
    steps: pl.DataFrame | None,
    summary: Mapping,
    path: str | Path,
    title: str,
    subtitle: str | None = None,
) -> Path:
    """Write the single-file offline HTML report of one replay; returns its path.

    `summary` is `analysis.metrics.summarize(requests, steps)`, passed in so the caller computes it once for the
    CLI, JSON and report; `subtitle` is a line of context such as "cost model: roofline-estimate".
    """
    header = f'<p class="subtitle">{html_text(subtitle)}</p>\n' if subtitle else ""
    header += summary_table_html(summary)
    header += limits_section_html(summary)  # a simulated run's warnings and prediction bands, if any
    return write_html(report_figures(requests, steps), path, title, header)
