"""The HTML report of one replay (simulated or on a GPU): summary tables plus charts.

The figure builders and page writer it uses are re-exported here so other
tools (sim-vs-real comparison, capacity sweeps) can build their own pages with
the same look from one import.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import polars as pl

from analysis.figures import Series, histogram_figure, latency_cdf_figure, timeseries_figure
from analysis.html_page import summary_table_html, write_html
from analysis.metrics import MS_PER_S, add_latency_columns, itl_values
from analysis.schema import FINISHED_REASONS, conform_requests, conform_steps

__all__ = [
    "CHART_TITLES",
    "Series",
    "histogram_figure",
    "latency_cdf_figure",
    "replica_series",
    "report_figures",
    "summary_table_html",
    "timeseries_figure",
    "write_html",
    "write_report",
]

CHART_TITLES: dict[str, str] = {
    "latency_cdf": "Latency CDFs (finished requests)",
    "latency_by_arrival": "TTFT and TPOT by arrival time",
    "queues": "Running and waiting sequences",
    "kv_usage": "KV cache usage",
    "tokens_per_step": "Tokens per step",
    "batch_histogram": "Batch size distribution",
}


def replica_series(
    frame: pl.DataFrame,
    x: str,
    y: str,
    scale: float = 1.0,
    replica_col: str = "replica",
    prefix: str = "",
) -> list[Series]:
    """One `Series` per replica of `frame` (sorted by `x`), named "replica N", y multiplied by `scale`.

    Keeping the name per replica (not per column) gives a replica the same colour on every panel.
    """
    data = frame.select(replica_col, x, y).drop_nulls().sort(replica_col, x)
    series = []
    for (replica,), group in data.group_by(replica_col, maintain_order=True):
        series.append(
            Series(
                name=f"{prefix}replica {replica}",
                x=group[x].to_numpy().astype(np.float64),
                y=group[y].to_numpy().astype(np.float64) * scale,
            )
        )
    return series


def report_figures(requests: pl.DataFrame, steps: pl.DataFrame | None) -> list[go.Figure]:
    """The standard charts of one replay, in page order (titles in `CHART_TITLES`)."""
    latencies = add_latency_columns(conform_requests(requests, ["replica", "arrival_s"]))
    finished = latencies.filter(pl.col("finish_reason").is_in(FINISHED_REASONS).fill_null(False))
    step_frame = conform_steps(steps)
    cdfs = latency_cdf_figure(
        {
            "TTFT": finished["ttft_s"] * MS_PER_S,
            "TPOT": finished["tpot_s"] * MS_PER_S,
            "ITL": itl_values(finished) * MS_PER_S,
            "E2E": finished["e2e_s"] * MS_PER_S,
        },
        title=CHART_TITLES["latency_cdf"],
    )
    by_arrival = timeseries_figure(
        {
            "TTFT (ms)": replica_series(latencies, "arrival_s", "ttft_s", MS_PER_S),
            "TPOT (ms)": replica_series(latencies, "arrival_s", "tpot_s", MS_PER_S),
        },
        title=CHART_TITLES["latency_by_arrival"],
        x_title="arrival time (s)",
        mode="markers",
    )
    queues = timeseries_figure(
        {
            "running sequences": replica_series(step_frame, "start_s", "num_running"),
            "waiting sequences": replica_series(step_frame, "start_s", "num_waiting"),
        },
        title=CHART_TITLES["queues"],
        x_title="step start time (s)",
    )
    kv_usage = timeseries_figure(
        {"KV cache usage (%)": replica_series(step_frame, "start_s", "kv_usage", 100.0)},
        title=CHART_TITLES["kv_usage"],
        x_title="step start time (s)",
    )
    tokens = timeseries_figure(
        {
            "prefill tokens per step": replica_series(step_frame, "start_s", "num_prefill_tokens"),
            "decode sequences per step": replica_series(step_frame, "start_s", "num_decode_seqs"),
            "step duration (ms)": replica_series(step_frame, "start_s", "duration_s", MS_PER_S),
        },
        title=CHART_TITLES["tokens_per_step"],
        x_title="step start time (s)",
    )
    batch_histogram = histogram_figure(
        {
            "batched tokens per step (tokens)": {"all replicas": step_frame["num_batched_tokens"]},
            "sequences per step (seqs)": {"all replicas": step_frame["num_seqs"]},
        },
        title=CHART_TITLES["batch_histogram"],
        y_title="steps",
    )
    return [cdfs, by_arrival, queues, kv_usage, tokens, batch_histogram]


def write_report(
    requests: pl.DataFrame,
    steps: pl.DataFrame | None,
    summary: Mapping,
    path: str | Path,
    title: str,
    subtitle: str | None = None,
) -> Path:
    """Write the single-file offline HTML report of one replay; returns its path.

    `summary` is `analysis.metrics.summarize(requests, steps)` (passed in so the
    caller computes it once for the CLI, JSON and report); `subtitle` is a line
    of context such as "cost model: roofline-estimate".
    """
    header = f'<p class="subtitle">{html.escape(subtitle)}</p>\n' if subtitle else ""
    header += summary_table_html(summary)
    return write_html(report_figures(requests, steps), path, title, header)
