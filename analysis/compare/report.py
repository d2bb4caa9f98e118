"""The sim-vs-real overlay report: both runs drawn on the same axes, one offline HTML page.

Uses the single-run report's figure builders so a comparison looks like two
reports laid on top of each other: one colour per run (per run and replica
when there are several replicas). Time axes start at each run's first arrival,
since a GPU replay's clock need not start at 0 like the simulator's.
"""

from __future__ import annotations

import dataclasses
import html
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analysis.compare.inputs import RunData
from analysis.compare.request_join import (
    PER_REQUEST_METRICS,
    REAL_SUFFIX,
    SIM_SUFFIX,
    RequestJoin,
    finished_on_both_sides,
)
from analysis.compare.tables import error_table_html
from analysis.formatting import LATENCY_LABELS, format_percent
from analysis.metrics import add_latency_columns, is_finished
from analysis.report.downsample import tail_preserving_sample
from analysis.report.figures import (
    ROW_HEIGHT_PX,
    Series,
    add_no_data,
    histogram_figure,
    latency_cdf_figure,
    timeseries_figure,
)
from analysis.report.html_page import table_html, write_html
from analysis.report.panels import KV_PANELS, QUEUE_PANELS, TOKEN_PANELS
from analysis.report.replay_report import CHART_TITLES, latency_samples_ms, replica_series
from analysis.stats import MS_PER_S

if TYPE_CHECKING:  # the comparison module writes this report, so it is imported for annotations only
    from analysis.compare.comparison import Comparison

COMPARE_CHART_TITLES: dict[str, str] = {
    "latency_cdf": "Latency CDFs, sim vs real (finished requests)",
    "request_scatter": "Per-request latency, sim vs real (y = x is a perfect match)",
    "request_error": "Per-request signed relative error of sim vs real (%)",
    "queues": CHART_TITLES["queues"],
    "kv_usage": CHART_TITLES["kv_usage"],
    "tokens_per_step": "Tokens per step and step duration",
    "step_histogram": "Step distributions",
    "step_cost": "Step duration by batch size",
}
MAX_SCATTER_POINTS = 8000
LOG_AXIS_MIN_RATIO = 100.0  # use log axes when a scatter's values span more than this factor
# A request id in a hover label: plotly reads its text as HTML-like markup (an id "<b>x</b>" showed as a bold x) and
# copies it into the page once per point and panel (8,000 ids of 10,000 characters made a 240 MB page): escaped and
# cut to this many characters, the page stays bounded whatever the trace's ids.
MAX_HOVER_ID_CHARS = 64


def hover_id(request_id: object) -> str:
    text = str(request_id)
    if len(text) > MAX_HOVER_ID_CHARS:
        text = text[:MAX_HOVER_ID_CHARS - 1] + "\u2026"
    return html.escape(text)


def time_origin_s(run: RunData) -> float:
    """The run's first arrival (s), used as t = 0 so both runs' time axes line up."""
    first = run.requests["arrival_s"].min() if run.requests.height else None
    if first is None and run.steps.height:
        first = run.steps["start_s"].min()
    return float(first) if first is not None else 0.0


def run_step_series(run: RunData, y: str, scale: float = 1.0, x: str = "start_s") -> list[Series]:
    """One series per replica of `run`'s steps, named after the run (and replica if several)."""
    origin = time_origin_s(run) if x == "start_s" else 0.0
    steps = run.steps.with_columns(pl.col("start_s") - origin) if x == "start_s" else run.steps
    series = replica_series(steps, x, y, scale, prefix=f"{run.label} ")
    return [dataclasses.replace(series[0], name=run.label)] if len(series) == 1 else series


def _overlay_panels(real: RunData, sim: RunData, panels: dict[str, tuple[str, float]], x: str = "start_s") -> dict:
    return {
        title: run_step_series(real, column, scale, x) + run_step_series(sim, column, scale, x)
        for title, (column, scale) in panels.items()
    }


def latency_cdf_overlay(real: RunData, sim: RunData) -> go.Figure:
    """The single-run report's latency CDFs, both runs on shared axes."""
    samples = {run.label: latency_samples_ms(add_latency_columns(run.requests).filter(is_finished()))
               for run in (real, sim)}
    metrics = {metric: {label: values[metric] for label, values in samples.items()} for metric in samples[real.label]}
    return latency_cdf_figure(metrics, title=COMPARE_CHART_TITLES["latency_cdf"])


def request_scatter_figure(join: RequestJoin) -> go.Figure:
    """Sim vs real TTFT/TPOT/E2E per matched request, with the y = x line; hover shows the request id."""
    fig = make_subplots(rows=1, cols=len(PER_REQUEST_METRICS), horizontal_spacing=0.07,
                        subplot_titles=[LATENCY_LABELS[key] for key in PER_REQUEST_METRICS])
    for col, key in enumerate(PER_REQUEST_METRICS, start=1):
        label = LATENCY_LABELS[key]
        pairs = join.frame.filter(finished_on_both_sides()).select(  # the pairs the errors are of
            "request_id",
            (pl.col(f"{key}_s{REAL_SUFFIX}") * MS_PER_S).alias("real"),
            (pl.col(f"{key}_s{SIM_SUFFIX}") * MS_PER_S).alias("sim"),
        ).drop_nulls()
        real, sim = pairs["real"].to_numpy(), pairs["sim"].to_numpy()
        if real.size == 0:
            add_no_data(fig, 1, col)
        else:
            keep = tail_preserving_sample(np.abs(sim - real), MAX_SCATTER_POINTS)
            fig.add_trace(
                go.Scattergl(
                    x=real[keep], y=sim[keep], text=[hover_id(i) for i in pairs["request_id"].to_numpy()[keep]],
                    mode="markers",
                    name="requests", legendgroup="requests", showlegend=col == 1,
                    marker={"size": 4, "opacity": 0.6, "color": "#636EFA"},
                    hovertemplate=f"request %{{text}}<br>real {label}: %{{x:.3f}} ms<br>sim {label}: %{{y:.3f}} ms"
                    "<extra></extra>",
                ),
                row=1, col=col,
            )
            both = np.concatenate([real, sim])
            low, high = float(both.min()), float(both.max())
            positive = both[both > 0]
            log_axes = positive.size == both.size and high / max(float(positive.min()), 1e-12) > LOG_AXIS_MIN_RATIO
            fig.add_trace(
                go.Scatter(x=[low, high], y=[low, high], mode="lines", name="y = x", legendgroup="y = x",
                           showlegend=col == 1, line={"color": "#888", "dash": "dash"},
                           hovertemplate="y = x<extra></extra>"),
                row=1, col=col,
            )
            if log_axes:
                fig.update_xaxes(type="log", row=1, col=col)
                fig.update_yaxes(type="log", row=1, col=col)
        fig.update_xaxes(title_text=f"real {label} (ms)", row=1, col=col)
        fig.update_yaxes(title_text=f"sim {label} (ms)", row=1, col=col)
    fig.update_layout(title=COMPARE_CHART_TITLES["request_scatter"], height=ROW_HEIGHT_PX + 200, hovermode="closest")
    return fig


def request_error_figure(join: RequestJoin) -> go.Figure:
    """CDFs of per-request signed relative errors (%), one panel per metric."""
    errors = {f"{LATENCY_LABELS[key]} rel. error": join.frame[f"{key}_rel_error"] * 100.0
              for key in PER_REQUEST_METRICS}
    return latency_cdf_figure(errors, title=COMPARE_CHART_TITLES["request_error"], unit="%",
                              num_columns=len(errors), default_series="sim vs real")


def step_figures(real: RunData, sim: RunData) -> list[go.Figure]:
    """Queues, KV usage, tokens per step, step distributions and step cost of both runs."""
    x_title = "time since first arrival (s)"
    token_panels = {"batched tokens per step": ("num_batched_tokens", 1.0), **TOKEN_PANELS}
    queues, kv_usage, tokens = (
        timeseries_figure(_overlay_panels(real, sim, panels), title=COMPARE_CHART_TITLES[name], x_title=x_title)
        for name, panels in (("queues", QUEUE_PANELS), ("kv_usage", KV_PANELS), ("tokens_per_step", token_panels))
    )
    histograms = histogram_figure(
        {
            "step duration (ms)": {run.label: run.steps["duration_s"] * MS_PER_S for run in (real, sim)},
            "batched tokens per step (tokens)": {run.label: run.steps["num_batched_tokens"] for run in (real, sim)},
            "sequences per step (seqs)": {run.label: run.steps["num_seqs"] for run in (real, sim)},
        },
        title=COMPARE_CHART_TITLES["step_histogram"], y_title="steps",
    )
    cost = timeseries_figure(
        _overlay_panels(real, sim, {"step duration (ms)": ("duration_s", MS_PER_S)}, x="num_batched_tokens"),
        title=COMPARE_CHART_TITLES["step_cost"], x_title="batched tokens per step (tokens)", mode="markers",
    )
    return [queues, kv_usage, tokens, histograms, cost]


def compare_figures(real: RunData, sim: RunData, join: RequestJoin) -> list[go.Figure]:
    """Every chart of the comparison page, in `COMPARE_CHART_TITLES` order."""
    return [latency_cdf_overlay(real, sim), request_scatter_figure(join), request_error_figure(join),
            *step_figures(real, sim)]


def _run_rows(real: RunData, sim: RunData, join: RequestJoin) -> list[tuple[str, str]]:
    return [
        ("real run", str(real.path)),
        ("sim run", str(sim.path)),
        ("sim cost model", sim.cost_model or "-"),
        ("real requests matched", f"{join.num_matched} / {join.num_real} ({format_percent(join.matched_share_real)})"),
        ("sim requests matched", f"{join.num_matched} / {join.num_sim} ({format_percent(join.matched_share_sim)})"),
    ]


def write_compare_report(comparison: Comparison, path: Path) -> Path:
    """Write the offline comparison page: context, error table, schedule verdict, then the charts."""
    real, sim, join = comparison.real, comparison.sim, comparison.join
    header = table_html(_run_rows(real, sim, join), caption="runs")
    if comparison.config_differences:
        rows = [(key, f"real {v['real']!r} / sim {v['sim']!r}") for key, v in comparison.config_differences.items()]
        header += table_html(rows, caption="config differences")
    if comparison.engine_notes:
        header += table_html([("engine", note) for note in comparison.engine_notes], caption="engine notes")
    header += error_table_html(comparison.rows)
    header += f'<pre style="white-space: pre-wrap">{html.escape(comparison.schedule.describe())}</pre>'
    title = f"Simulation vs real: {sim.name} vs {real.name}"
    return write_html(compare_figures(real, sim, join), path, title, header)
