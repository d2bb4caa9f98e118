"""Reusable plotly figure builders for replay reports.

Builders take plain named arrays (not replay tables) so that a single-run
report, a sim-vs-real comparison and a capacity sweep can all draw the same
kinds of charts with several runs or replicas overlaid. Every builder labels
its axes with units, sets hover text, and reduces large inputs (see
`analysis.report.downsample`) so pages stay small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from analysis.report.downsample import bucket_mean_max, cdf_points, histogram_edges, tail_preserving_sample
from analysis.stats import finite_values

PALETTE: tuple[str, ...] = tuple(qualitative.Plotly)
ROW_HEIGHT_PX = 260
MAX_CDF_POINTS = 2000
# A time series longer than this many points is drawn as a mean and a max per time bucket, this many buckets.
NUM_TIME_BUCKETS = 400
MAX_SCATTER_POINTS_PER_PANEL = 16000
MAX_BINS = 60


@dataclass(frozen=True)
class Series:
    """One named (x, y) trace; `name` picks its colour and legend entry across panels."""

    name: str
    x: np.ndarray
    y: np.ndarray


def _colors() -> Callable[[str], str]:
    """Stable colour per series name, so one run/replica has one colour on every panel."""
    by_name: dict[str, str] = {}
    return lambda name: by_name.setdefault(name, PALETTE[len(by_name) % len(PALETTE)])


def _as_named(values: object, default_name: str) -> Mapping[str, object]:
    """Accept either one array or a mapping of series name to array."""
    return values if isinstance(values, Mapping) else {default_name: values}


def add_no_data(fig: go.Figure, row: int | None = None, col: int | None = None) -> None:
    """Say "no data" in an empty panel rather than leave blank axes."""
    kwargs = {} if row is None else {"row": row, "col": col}
    fig.add_annotation(text="no data", showarrow=False, x=0.5, y=0.5, xref="x domain", yref="y domain", **kwargs)


def latency_cdf_figure(metrics: Mapping[str, object], title: str = "Latency CDFs", unit: str = "ms",
                       num_columns: int = 2, default_series: str = "run") -> go.Figure:
    """A grid of empirical CDFs, one subplot per metric.

    `metrics` maps a metric label (e.g. "TTFT") to an array of values in `unit`,
    or to {series name: array} to overlay runs (e.g. {"sim": ..., "real": ...}).
    """
    names = list(metrics)
    num_columns = max(1, min(num_columns, len(names) or 1))
    num_rows = max(1, math.ceil(len(names) / num_columns))
    fig = make_subplots(rows=num_rows, cols=num_columns, subplot_titles=names or None, horizontal_spacing=0.08,
                        vertical_spacing=0.15 if num_rows > 1 else 0.1)
    colors = _colors()
    shown: set[str] = set()
    for index, metric in enumerate(names):
        row, col = index // num_columns + 1, index % num_columns + 1
        has_data = False
        for series_name, values in _as_named(metrics[metric], default_series).items():
            x, y = cdf_points(finite_values(values), MAX_CDF_POINTS)
            if x.size == 0:
                continue
            has_data = True
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines", line={"shape": "hv", "color": colors(series_name)}, name=series_name,
                legendgroup=series_name, showlegend=series_name not in shown,
                hovertemplate=f"{series_name}<br>{metric}: %{{x:.3f}} {unit}<br>fraction ≤: %{{y:.4f}}<extra></extra>",
            ), row=row, col=col)
            shown.add(series_name)
        fig.update_xaxes(title_text=f"{metric} ({unit})", row=row, col=col)
        fig.update_yaxes(title_text="cumulative fraction", range=[0, 1.02], row=row, col=col)
        if not has_data:
            add_no_data(fig, row, col)
    fig.update_layout(title=title, height=ROW_HEIGHT_PX * num_rows + 120, hovermode="closest")
    return fig


def timeseries_figure(panels: Mapping[str, Sequence[Series]], title: str, x_title: str = "time (s)",
                      mode: str = "lines") -> go.Figure:
    """Stacked panels sharing the x axis; `panels` maps a y-axis title (with units) to series.

    `mode="lines"` draws a step line, or for a long series its mean per time bucket (solid) and its
    max per bucket (dotted, same colour and legend entry), so a level and its spikes both read.
    `mode="markers"` draws a scatter keeping the largest values plus a uniform sample; the scatter
    budget is per panel and split between its series, so the page size does not grow with the number
    of replicas or runs overlaid.
    """
    if mode not in ("lines", "markers"):
        raise ValueError(f"mode must be 'lines' or 'markers', not {mode!r}")
    titles = list(panels) or [""]
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.06)
    colors = _colors()
    shown: set[str] = set()
    for row, y_title in enumerate(titles, start=1):
        series_list = panels.get(y_title, []) if panels else []
        budget = max(200, MAX_SCATTER_POINTS_PER_PANEL // max(1, len(series_list)))
        for series in series_list:
            x, y = np.asarray(series.x, dtype=np.float64), np.asarray(series.y, dtype=np.float64)
            first = series.name not in shown
            common = {"name": series.name, "legendgroup": series.name, "mode": mode}
            hover = f"{series.name}<br>{x_title}: %{{x:.3f}}<br>{y_title}: %{{y:.4~g}}"
            if mode == "markers":
                keep = tail_preserving_sample(y, budget)
                fig.add_trace(go.Scattergl(
                    x=x[keep], y=y[keep], showlegend=first, hovertemplate=hover + "<extra></extra>",
                    marker={"size": 4, "opacity": 0.6, "color": colors(series.name)}, **common,
                ), row=row, col=1)
            elif len(x) <= NUM_TIME_BUCKETS:
                fig.add_trace(go.Scatter(
                    x=x, y=y, showlegend=first, hovertemplate=hover + "<extra></extra>",
                    line={"shape": "hv", "color": colors(series.name)}, **common,
                ), row=row, col=1)
            else:
                centres, means, maxes = bucket_mean_max(x, y, NUM_TIME_BUCKETS)
                width = (float(x.max()) - float(x.min())) / NUM_TIME_BUCKETS
                for values, what, line in (
                    (means, "mean", {"color": colors(series.name)}),
                    (maxes, "max", {"color": colors(series.name), "dash": "dot", "width": 1}),
                ):
                    fig.add_trace(go.Scatter(
                        x=centres, y=values, line=line, showlegend=first and what == "mean",
                        hovertemplate=f"{hover} ({what} of {width:.3g} s)<extra></extra>", **common,
                    ), row=row, col=1)
            shown.add(series.name)
        fig.update_yaxes(title_text=y_title, row=row, col=1)
        if not series_list:
            add_no_data(fig, row, 1)
    fig.update_xaxes(title_text=x_title, row=len(titles), col=1)
    fig.update_layout(title=title, height=ROW_HEIGHT_PX * len(titles) + 120, hovermode="closest")
    return fig


def histogram_figure(panels: Mapping[str, object], title: str, y_title: str = "count",
                     default_series: str = "run") -> go.Figure:
    """Side-by-side histograms; `panels` maps an x-axis title to values or {series: values}.

    Binned here with numpy so the page carries bin counts, not every sample.
    """
    titles = list(panels) or [""]
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.08)
    colors = _colors()
    shown: set[str] = set()
    for col, x_title in enumerate(titles, start=1):
        named = _as_named(panels[x_title], default_series) if panels else {}
        arrays = {name: finite_values(values) for name, values in named.items()}
        pooled = [array for array in arrays.values() if array.size]
        if not pooled:
            add_no_data(fig, 1, col)
        else:
            edges, log_x = histogram_edges(np.concatenate(pooled), MAX_BINS)
            for series_name, array in arrays.items():
                counts, _ = np.histogram(array, bins=edges)
                fig.add_trace(go.Bar(
                    x=np.sqrt(edges[:-1] * edges[1:]) if log_x else (edges[:-1] + edges[1:]) / 2, y=counts,
                    width=np.diff(edges), name=series_name,
                    legendgroup=series_name, showlegend=series_name not in shown,
                    marker={"color": colors(series_name)}, opacity=0.7 if len(arrays) > 1 else 1.0,
                    customdata=np.stack([edges[:-1], edges[1:]], axis=1),
                    hovertemplate=f"{series_name}<br>{x_title}: %{{customdata[0]:.4~g}}–%{{customdata[1]:.4~g}}"
                    f"<br>{y_title}: %{{y}}<extra></extra>",
                ), row=1, col=col)
                shown.add(series_name)
            if log_x:
                fig.update_xaxes(type="log", row=1, col=col)
        fig.update_xaxes(title_text=x_title, row=1, col=col)
        fig.update_yaxes(title_text=y_title, row=1, col=col)
    fig.update_layout(title=title, height=ROW_HEIGHT_PX + 160, barmode="overlay", hovermode="closest")
    return fig
