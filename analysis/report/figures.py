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


def _grid(rows: int, cols: int, h_spacing: float, v_spacing: float, shared_x: bool = False,
          titles: Sequence[str] = ()) -> tuple[dict, list[tuple[str, str]]]:
    """The layout of a rows x cols grid of subplots as plotly's make_subplots lays it out (cells numbered from the
    top left, row by row; ``shared_x``: one column whose upper panels follow the bottom one's x range and show no
    tick labels; ``titles`` above the cells), and each cell's (x axis, y axis) trace references.

    The builders assemble each figure's traces and layout first and construct it once: make_subplots and the
    per-cell update calls validated every property path again and again, most of a report's CPU time."""
    width = (1 - h_spacing * (cols - 1)) / cols
    height = (1 - v_spacing * (rows - 1)) / rows
    layout: dict = {}
    cells = []
    annotations = []
    bottom = f"x{rows * cols}" if rows * cols > 1 else "x"
    for r in range(rows):
        for c in range(cols):
            k = r * cols + c + 1
            suffix = "" if k == 1 else str(k)
            x0, y1 = c * (width + h_spacing), 1 - r * (height + v_spacing)
            x_axis = {"anchor": f"y{suffix}", "domain": [x0, x0 + width]}
            if shared_x and r < rows - 1:
                x_axis.update(matches=bottom, showticklabels=False)
            layout[f"xaxis{suffix}"] = x_axis
            layout[f"yaxis{suffix}"] = {"anchor": f"x{suffix}", "domain": [max(y1 - height, 0.0), y1]}
            cells.append((f"x{suffix}", f"y{suffix}"))
            if k <= len(titles):
                annotations.append({"font": {"size": 16}, "showarrow": False, "text": titles[k - 1],
                                    "x": x0 + width / 2, "xanchor": "center", "xref": "paper", "y": y1,
                                    "yanchor": "bottom", "yref": "paper"})
    if annotations:
        layout["annotations"] = annotations
    return layout, cells


def _no_data(cell: tuple[str, str]) -> dict:
    return {"text": "no data", "showarrow": False, "x": 0.5, "y": 0.5, "xref": f"{cell[0]} domain",
            "yref": f"{cell[1]} domain"}


def _axis_name(ref: str) -> str:
    """The layout key of a trace's axis reference: "x2" -> "xaxis2"."""
    return f"{ref[0]}axis{ref[1:]}"


def add_no_data(fig: go.Figure, row: int | None = None, col: int | None = None) -> None:
    """Say "no data" in an empty panel rather than leave blank axes."""
    kwargs = {} if row is None else {"row": row, "col": col}
    fig.add_annotation(text="no data", showarrow=False, x=0.5, y=0.5, xref="x domain", yref="y domain", **kwargs)


def latency_cdf_figure(metrics: Mapping[str, object], title: str = "Latency CDFs", unit: str = "ms",
                       num_columns: int = 2, default_series: str = "run", scale: float = 1.0) -> go.Figure:
    """A grid of empirical CDFs, one subplot per metric.

    `metrics` maps a metric label (e.g. "TTFT") to an array of values in `unit`,
    or to {series name: array} to overlay runs (e.g. {"sim": ..., "real": ...}). `scale` (> 0): the values are
    in `unit` once multiplied by it (s to ms: 1e3); only the points drawn are, the same as scaling every value
    first (a positive factor keeps their order) without a pass over millions of them.
    """
    names = list(metrics)
    num_columns = max(1, min(num_columns, len(names) or 1))
    num_rows = max(1, math.ceil(len(names) / num_columns))
    layout, cells = _grid(num_rows, num_columns, 0.08, 0.15 if num_rows > 1 else 0.1, titles=names)
    colors = _colors()
    shown: set[str] = set()
    traces = []
    empty = []
    for index, metric in enumerate(names):
        cell = cells[index]
        has_data = False
        for series_name, values in _as_named(metrics[metric], default_series).items():
            x, y = cdf_points(finite_values(values), MAX_CDF_POINTS)
            if x.size == 0:
                continue
            has_data = True
            traces.append(go.Scatter(
                x=x * scale, y=y, mode="lines", line={"shape": "hv", "color": colors(series_name)}, name=series_name,
                legendgroup=series_name, showlegend=series_name not in shown, xaxis=cell[0], yaxis=cell[1],
                hovertemplate=f"{series_name}<br>{metric}: %{{x:.3f}} {unit}<br>fraction ≤: %{{y:.4f}}<extra></extra>",
            ))
            shown.add(series_name)
        layout[_axis_name(cell[0])]["title"] = {"text": f"{metric} ({unit})"}
        layout[_axis_name(cell[1])].update(title={"text": "cumulative fraction"}, range=[0, 1.02])
        if not has_data:
            empty.append(_no_data(cell))
    if empty:
        layout["annotations"] = [*layout.get("annotations", []), *empty]
    layout.update(title={"text": title}, height=ROW_HEIGHT_PX * num_rows + 120, hovermode="closest")
    return go.Figure(data=traces, layout=layout)


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
    layout, cells = _grid(len(titles), 1, 0.0, 0.06, shared_x=True)
    colors = _colors()
    shown: set[str] = set()
    traces = []
    empty = []
    for cell, y_title in zip(cells, titles):
        on_cell = {"xaxis": cell[0], "yaxis": cell[1]}
        series_list = panels.get(y_title, []) if panels else []
        budget = max(200, MAX_SCATTER_POINTS_PER_PANEL // max(1, len(series_list)))
        for series in series_list:
            x, y = np.asarray(series.x, dtype=np.float64), np.asarray(series.y, dtype=np.float64)
            first = series.name not in shown
            common = {"name": series.name, "legendgroup": series.name, "mode": mode, **on_cell}
            hover = f"{series.name}<br>{x_title}: %{{x:.3f}}<br>{y_title}: %{{y:.4~g}}"
            if mode == "markers":
                keep = tail_preserving_sample(y, budget)
                traces.append(go.Scattergl(
                    x=x[keep], y=y[keep], showlegend=first, hovertemplate=hover + "<extra></extra>",
                    marker={"size": 4, "opacity": 0.6, "color": colors(series.name)}, **common,
                ))
            elif len(x) <= NUM_TIME_BUCKETS:
                traces.append(go.Scatter(
                    x=x, y=y, showlegend=first, hovertemplate=hover + "<extra></extra>",
                    line={"shape": "hv", "color": colors(series.name)}, **common,
                ))
            else:
                centres, means, maxes = bucket_mean_max(x, y, NUM_TIME_BUCKETS)
                width = (float(x.max()) - float(x.min())) / NUM_TIME_BUCKETS
                for values, what, line in (
                    (means, "mean", {"color": colors(series.name)}),
                    (maxes, "max", {"color": colors(series.name), "dash": "dot", "width": 1}),
                ):
                    traces.append(go.Scatter(
                        x=centres, y=values, line=line, showlegend=first and what == "mean",
                        hovertemplate=f"{hover} ({what} of {width:.3g} s)<extra></extra>", **common,
                    ))
            shown.add(series.name)
        layout[_axis_name(cell[1])]["title"] = {"text": y_title}
        if not series_list:
            empty.append(_no_data(cell))
    layout[_axis_name(cells[-1][0])]["title"] = {"text": x_title}
    if empty:
        layout["annotations"] = empty
    layout.update(title={"text": title}, height=ROW_HEIGHT_PX * len(titles) + 120, hovermode="closest")
    return go.Figure(data=traces, layout=layout)


def histogram_figure(panels: Mapping[str, object], title: str, y_title: str = "count",
                     default_series: str = "run") -> go.Figure:
    """Side-by-side histograms; `panels` maps an x-axis title to values or {series: values}.

    Binned here with numpy so the page carries bin counts, not every sample.
    """
    titles = list(panels) or [""]
    layout, cells = _grid(1, len(titles), 0.08, 0.0)
    colors = _colors()
    shown: set[str] = set()
    traces = []
    empty = []
    for cell, x_title in zip(cells, titles):
        named = _as_named(panels[x_title], default_series) if panels else {}
        arrays = {name: finite_values(values) for name, values in named.items()}
        pooled = [array for array in arrays.values() if array.size]
        x_axis = layout[_axis_name(cell[0])]
        if not pooled:
            empty.append(_no_data(cell))
        else:
            # One series (a single run's panel): its own array, not a copy (1.8M steps' values).
            edges, log_x = histogram_edges(pooled[0] if len(pooled) == 1 else np.concatenate(pooled), MAX_BINS)
            for series_name, array in arrays.items():
                counts, _ = np.histogram(array, bins=edges)
                traces.append(go.Bar(
                    x=np.sqrt(edges[:-1] * edges[1:]) if log_x else (edges[:-1] + edges[1:]) / 2, y=counts,
                    width=np.diff(edges), name=series_name, xaxis=cell[0], yaxis=cell[1],
                    legendgroup=series_name, showlegend=series_name not in shown,
                    marker={"color": colors(series_name)}, opacity=0.7 if len(arrays) > 1 else 1.0,
                    customdata=np.stack([edges[:-1], edges[1:]], axis=1),
                    hovertemplate=f"{series_name}<br>{x_title}: %{{customdata[0]:.4~g}}–%{{customdata[1]:.4~g}}"
                    f"<br>{y_title}: %{{y}}<extra></extra>",
                ))
                shown.add(series_name)
            if log_x:
                x_axis["type"] = "log"
        x_axis["title"] = {"text": x_title}
        layout[_axis_name(cell[1])]["title"] = {"text": y_title}
    if empty:
        layout["annotations"] = empty
    layout.update(title={"text": title}, height=ROW_HEIGHT_PX + 160, barmode="overlay", hovermode="closest")
    return go.Figure(data=traces, layout=layout)
