"""The HTML report of one replay (simulated or on a GPU): summary tables plus charts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import polars as pl

from analysis.formatting import LATENCY_LABELS, SERVICE_LATENCIES
from analysis.metrics import add_latency_columns, is_finished, latency_samples_s
from analysis.report.figures import Series, histogram_figure, latency_cdf_figure, timeseries_figure
from analysis.report.html_page import html_text, write_html
from analysis.report.limits_section import limits_section_html
from analysis.report.panels import (
    BATCH_HISTOGRAMS,
    KV_PANELS,
    QUEUE_PANELS,
    REPORT_STEP_INPUTS,
    STEP_TIME_COLUMN,
    TOKEN_PANELS,
)
from analysis.report.summary_table import summary_table_html
from analysis.schema import conform_requests, conform_steps
from analysis.stats import MS_PER_S

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
    changes = _replica_changes(replicas)
    if not _strictly_sorted(replicas, xs, changes):  # a step log is already sorted: its sort and group-by cost the most
        data = data.sort("replica", x)
        replicas, xs = data["replica"].to_numpy(), data[x].to_numpy()
        changes = _replica_changes(replicas)
    return _split_by_replica(replicas, xs.astype(np.float64, copy=False), changes, data[y], scale, prefix)


def replica_series_of(frame: pl.DataFrame, x: str) -> Callable[[str, float], list[Series]]:
    """``replica_series(frame, x, y, scale)`` as a function of ``y`` and ``scale``: where neither the replicas nor
    ``x`` hold nulls and the rows are in order already (a step log), both are read and checked once for every y
    column (a report's six step panels) instead of once a column."""
    if frame["replica"].null_count() or frame[x].null_count():
        return lambda y, scale=1.0: replica_series(frame, x, y, scale)
    replicas, xs = frame["replica"].to_numpy(), frame[x].to_numpy()
    changes = _replica_changes(replicas)
    if not _strictly_sorted(replicas, xs, changes):
        return lambda y, scale=1.0: replica_series(frame, x, y, scale)
    xs = xs.astype(np.float64, copy=False)

    def series(y: str, scale: float = 1.0) -> list[Series]:
        if frame[y].null_count():  # its rows with nulls left out: replica_series' own split
            return replica_series(frame, x, y, scale)
        return _split_by_replica(replicas, xs, changes, frame[y], scale)

    return series


def _split_by_replica(replicas: np.ndarray, xs: np.ndarray, changes: np.ndarray, y: pl.Series, scale: float,
                      prefix: str = "") -> list[Series]:
    """One `Series` per run of rows of one replica (``changes``: `_replica_changes`), ``y`` multiplied by
    ``scale``. Read, never written: views where a column is float64 already (no copy of a 1.8M-step log's column per
    panel), and no multiplication by a scale of 1 (the same values)."""
    ys = y.to_numpy().astype(np.float64, copy=False)
    if scale != 1.0:
        ys = ys * scale
    bounds = [0, *(changes + 1).tolist(), len(replicas)]
    return [
        Series(name=f"{prefix}replica {replicas[start]}", x=xs[start:end], y=ys[start:end])
        for start, end in zip(bounds, bounds[1:])
        if end > start
    ]


def _replica_changes(replicas: np.ndarray) -> np.ndarray:
    """The rows after which the next row's replica is another."""
    return np.flatnonzero(replicas[1:] != replicas[:-1])


def _strictly_sorted(replicas: np.ndarray, x: np.ndarray, changes: np.ndarray) -> bool:
    """Whether rows are ordered by replica, then by strictly increasing x (ties: a sort may reorder them);
    ``changes``: ``_replica_changes(replicas)``. Checked where the replica changes, then along x elsewhere: two
    passes over a step log instead of five (the report checks six of its columns' series)."""
    if len(x) < 2:
        return True
    if not np.all(replicas[changes + 1] > replicas[changes]):
        return False
    increasing = x[1:] > x[:-1]
    increasing[changes] = True  # a new replica's first row may start before the last one's last
    return bool(increasing.all())


def labelled_latency_samples_s(finished: pl.DataFrame, itl_s: np.ndarray | None = None) -> dict[str, object]:
    """{label: values in s} of each of `SERVICE_LATENCIES` over `finished` requests (with latency columns);
    `itl_s`: their pooled token gaps (`itl_values`) where the caller has them already."""
    return {LATENCY_LABELS[metric]: (itl_s if metric == "itl" and itl_s is not None
                                     else latency_samples_s(finished, metric))
            for metric in SERVICE_LATENCIES}


def latency_samples_ms(finished: pl.DataFrame) -> dict[str, object]:
    """`labelled_latency_samples_s` in ms."""
    return {label: values * MS_PER_S for label, values in labelled_latency_samples_s(finished).items()}


def report_figures(requests: pl.DataFrame, steps: pl.DataFrame | None,
                   itl_s: np.ndarray | None = None) -> list[go.Figure]:
    """The standard charts of one replay, in page order (titles in `CHART_TITLES`); `itl_s`: the finished requests'
    pooled token gaps (`analysis.metrics.itl_values`, in any order: a CDF draws them) where the caller has them
    already, as a summary does."""
    latencies = add_latency_columns(conform_requests(requests, ["replica", "arrival_s"]))
    step_frame = conform_steps(steps, REPORT_STEP_INPUTS)
    # Drawn in ms, scaled after thinning: the summary's millions of token gaps are not copied to be scaled.
    cdfs = latency_cdf_figure(labelled_latency_samples_s(latencies.filter(is_finished()), itl_s),
                              title=CHART_TITLES["latency_cdf"], scale=MS_PER_S)
    by_arrival = timeseries_figure(
        {
            "TTFT (ms)": replica_series(latencies, "arrival_s", "ttft_s", MS_PER_S),
            "TPOT (ms)": replica_series(latencies, "arrival_s", "tpot_s", MS_PER_S),
        },
        title=CHART_TITLES["latency_by_arrival"],
        x_title="arrival time (s)",
        mode="markers",
    )
    step_series = replica_series_of(step_frame, STEP_TIME_COLUMN)
    step_panels = [
        timeseries_figure(
            {y_title: step_series(column, scale) for y_title, (column, scale) in panels.items()},
            title=CHART_TITLES[name],
            x_title="step start time (s)",
        )
        for name, panels in (("queues", QUEUE_PANELS), ("kv_usage", KV_PANELS), ("tokens_per_step", TOKEN_PANELS))
    ]
    batch_histogram = histogram_figure(
        {x_title: {"all replicas": step_frame[column]} for x_title, column in BATCH_HISTOGRAMS.items()},
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
    itl_s: np.ndarray | None = None,
) -> Path:
    """Write the single-file offline HTML report of one replay; returns its path.

    `summary` is `analysis.metrics.summarize(requests, steps)`, passed in so the caller computes it once for the
    CLI, JSON and report; `subtitle` is a line of context such as "cost model: roofline-estimate"; `itl_s` as
    `report_figures` takes it.
    """
    header = f'<p class="subtitle">{html_text(subtitle)}</p>\n' if subtitle else ""
    header += summary_table_html(summary)
    header += limits_section_html(summary)  # a simulated run's warnings and prediction bands, if any
    return write_html(report_figures(requests, steps, itl_s), path, title, header)
