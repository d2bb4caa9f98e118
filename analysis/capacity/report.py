"""report.html of a capacity sweep: latency and goodput versus load, max QPS, replicas needed,
cost per million output tokens and the cost/latency Pareto front, in one offline page.

The page carries an editable $/GPU-hour table: changing a price recomputes the cost bars and the
Pareto front in the browser with the same formulas as `analysis.capacity.cost`, so a reader can
try their own prices without rerunning the sweep.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.capacity.cost import MAX_USD_PER_GPU_HOUR, ConfigEconomics, replicas_needed_by_family
from analysis.capacity.plan import CapacityRun
from analysis.capacity.point import PointResult
from analysis.capacity.sweep import ANSWER, ANSWER_KINDS, ConfigResult
from analysis.formatting import format_number
from analysis.report.figures import PALETTE
from analysis.report.html_page import html_text, table_html, write_html
from analysis.slo import SLO

CHART_HEIGHT_PX = 460
CHART_TITLES: dict[str, str] = {
    "latency": "Latency versus offered load (circle: met every SLO and stable; cross: missed one; triangle: unstable)",
    "goodput": "Goodput versus offered load",
    "max_qps": "Highest stable QPS meeting every SLO (hatched: a bound, not an answer)",
    "replicas": "Replicas needed for the target QPS",
    "cost": "Cost per million output tokens at max QPS",
    "pareto": "Cost versus latency at max QPS (Pareto front)",
}
# Figures the in-page cost editor redraws, found in the page by their layout.meta.
COST_META = "capacity-cost"
PARETO_META = "capacity-pareto"


def _color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


# How a simulated point is drawn: met every SLO and stable (an answer can only be such a point), missed an
# SLO, met the SLOs but was unstable (its backlog grew), and the answer simulated again on a stream twice as long.
POINT_SYMBOLS: dict[str, tuple[str, str]] = {
    "feasible": ("circle", "met every SLO, stable"),
    "missed": ("x", "missed an SLO"),
    "unstable": ("triangle-up-open", "met the SLOs but unstable (backlog grew)"),
}
CHECK_SYMBOL = "star"


def point_status(point: PointResult) -> str:
    if point.feasible:
        return "feasible"
    return "missed" if not point.meets_slos else "unstable"


def _point_hover(point: PointResult) -> str:
    window = point.stability
    text = (f"{POINT_SYMBOLS[point_status(point)][1]}{'; stopped early' if point.stopped_early else ''}"
            f"<br>completions / arrivals: {format_number(window.get('completion_ratio'), '.3f')}"
            f"; backlog growth: {format_number(window.get('backlog_growth_fraction'), '+.1%')} of arrivals"
            f"<br>stream: {point.stream_duration_s:g} s, seed {point.seed}")
    return text + (" (twice as long: the T-versus-2T check)" if point.duration_scale != 1.0 else "")


def _plotted_points(result: ConfigResult) -> list[PointResult]:
    """The median seed's points by QPS, then its T-versus-2T checks."""
    search = result.median_search
    return sorted(search.points, key=lambda p: p.qps) + list(search.checks)


def _symbols(points: Sequence[PointResult]) -> list[str]:
    return [CHECK_SYMBOL if p.duration_scale != 1.0 else POINT_SYMBOLS[point_status(p)][0] for p in points]


def _symbol_legend(fig: go.Figure, **position) -> None:
    """Legend entries that explain the marker symbols (data-less traces)."""
    entries = [(symbol, text) for symbol, text in POINT_SYMBOLS.values()]
    entries.append((CHECK_SYMBOL, "the answer on a stream twice as long"))
    for symbol, text in entries:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=text, legendgroup="symbols",
                                 marker={"symbol": symbol, "color": "gray", "size": 9}, hoverinfo="skip"), **position)


def _log_axis_ok(values: Sequence[float | None]) -> bool:
    """A log axis only when every value is positive (else plotly drops points silently)."""
    present = [v for v in values if v is not None]
    return bool(present) and min(present) > 0


def _titled(fig: go.Figure, title: str, x_title: str, y_title: str, **layout) -> go.Figure:
    """Axis titles and layout of a one-panel chart."""
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    fig.update_layout(title=title, height=CHART_HEIGHT_PX, **layout)
    return fig


def latency_figure(results: Sequence[ConfigResult], slos: Sequence[SLO]) -> go.Figure:
    """One panel per SLO: its statistic (ms) at every QPS tried, per configuration, with the limit."""
    fig = make_subplots(rows=len(slos), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[f"{slo.label} (limit {format_number(slo.limit_ms, '.4g', ' ms')})"
                                        for slo in slos])
    highest_qps = max((p.qps for r in results for p in r.points), default=1.0)
    for row, slo in enumerate(slos, start=1):
        values_all: list[float | None] = [slo.limit_ms]
        for result in results:
            values_all += [p.slo_values_ms.get(slo.key) for p in _plotted_points(result)]
        # A point that missed with no value (unbounded: requests unfinished, or a run stopped early on a certain miss)
        # is drawn above every value of the panel and said so on hover; left out (plotly drops a None), a search's
        # failures at those loads were missing from the chart. A point with no samples that met the SLOs stays out.
        above_ms = 1.5 * max(v for v in values_all if v is not None)
        for result in results:
            points = _plotted_points(result)
            values = [p.slo_values_ms.get(slo.key) for p in points]
            unbounded = [v is None and not p.meets_slos for p, v in zip(points, values)]
            shown = [f"above {format_number(slo.limit_ms, '.4g')} ms, unbounded (drawn at the top)" if beyond
                     else "no samples" if v is None else f"{v:.4g} ms" for v, beyond in zip(values, unbounded)]
            fig.add_trace(go.Scatter(
                x=[p.qps for p in points], y=[above_ms if beyond else v for v, beyond in zip(values, unbounded)],
                mode="markers",
                name=result.label, legendgroup=result.label, showlegend=row == 1,
                marker={"symbol": _symbols(points), "size": 10, "color": _color(result.index)},
                customdata=[[_point_hover(p), p.num_rejected, _goodput_text(p), text]
                            for p, text in zip(points, shown)],
                hovertemplate=(
                    f"{html_text(result.label)}<br>offered load: %{{x:.4g}} req/s<br>{slo.label}: %{{customdata[3]}}"
                    "<br>%{customdata[0]}<br>rejected: %{customdata[1]}; goodput: %{customdata[2]}"
                    "<extra></extra>"
                ),
            ), row=row, col=1)
        fig.add_trace(  # a trace, not add_hline: a legend entry, hover text, and log axes stay correct
            go.Scatter(x=[0.0, highest_qps * 1.05], y=[slo.limit_ms, slo.limit_ms], mode="lines", name="SLO limit",
                       legendgroup="SLO limit", showlegend=row == 1, line={"color": "crimson", "dash": "dash"},
                       hovertemplate=f"SLO {slo}: {slo.label} <= %{{y:.4g}} ms<extra></extra>"),
            row=row, col=1,
        )
        log = _log_axis_ok(values_all)
        fig.update_yaxes(title_text=f"{slo.label} (ms{', log' if log else ''})", type="log" if log else "linear",
                         row=row, col=1)
    _symbol_legend(fig, row=1, col=1)
    fig.update_xaxes(title_text="offered load (requests/s)", row=len(slos), col=1)
    fig.update_layout(title=CHART_TITLES["latency"], height=300 * len(slos) + 160, hovermode="closest")
    return fig


def _goodput_text(point: PointResult) -> str:
    if point.goodput_rps is None:
        return "not measured (stopped early: the part simulated is not the load's)"
    return f"{point.goodput_rps:.4g} req/s"


def goodput_figure(results: Sequence[ConfigResult]) -> go.Figure:
    """Goodput against offered load; the diagonal is "every request met every SLO". Points stopped early have no
    goodput (PointResult.goodput_rps): left out, and counted in the title."""
    fig = go.Figure()
    highest = max((p.qps for r in results for p in r.all_points), default=1.0)
    fig.add_trace(go.Scatter(x=[0, highest], y=[0, highest], mode="lines", name="goodput = offered load",
                             line={"dash": "dot", "color": "gray"}, hoverinfo="skip"))
    num_stopped = 0
    for result in results:
        points = _plotted_points(result)
        num_stopped += sum(p.goodput_rps is None for p in points)
        points = [p for p in points if p.goodput_rps is not None]
        fig.add_trace(go.Scatter(
            x=[p.qps for p in points], y=[p.goodput_rps for p in points], mode="markers", name=result.label,
            marker={"symbol": _symbols(points), "size": 10, "color": _color(result.index)},
            customdata=[[p.num_finished, p.num_requests, _point_hover(p)] for p in points],
            hovertemplate=f"{html_text(result.label)}<br>offered load: %{{x:.4g}} req/s"
            "<br>goodput: %{y:.4g} req/s (measured window)<br>finished: %{customdata[0]} / %{customdata[1]}"
            "<br>%{customdata[2]}<extra></extra>",
        ))
    _symbol_legend(fig)
    title = CHART_TITLES["goodput"]
    if num_stopped:  # (the latency chart draws them: each missed an SLO for certain)
        title += (f" ({num_stopped} point{'s' if num_stopped > 1 else ''} stopped early, each missing an SLO: goodput "
                  "not measured, not drawn)")
    return _titled(fig, title, "offered load (requests/s)", "goodput (requests/s meeting every SLO)",
                   hovermode="closest")


def max_qps_figure(results: Sequence[ConfigResult]) -> go.Figure:
    """One bar per configuration: solid for a converged answer, hatched and labelled (">=", "~", "?") for
    anything else, with the seeds' range as an error bar."""
    fig = go.Figure()
    for kind, text in ANSWER_KINDS.items():
        chosen = [r for r in results if r.kind == kind and r.max_qps is not None]
        if not chosen:
            continue
        answer = kind in ANSWER
        spreads = [r.spread or (r.max_qps, r.max_qps) for r in chosen]
        above = [hi - r.max_qps for r, (_, hi) in zip(chosen, spreads)]
        below = [r.max_qps - lo for r, (lo, _) in zip(chosen, spreads)]
        fig.add_trace(go.Bar(
            x=[r.label for r in chosen], y=[r.max_qps for r in chosen], name=text.split(":")[0],
            marker={"color": [_color(r.index) for r in chosen], "pattern": {"shape": "" if answer else "/"},
                    "opacity": 1.0 if answer else 0.5},
            error_y={"type": "data", "symmetric": False, "array": above, "arrayminus": below, "visible": True},
            text=[r.answer_text for r in chosen], textposition="outside",
            customdata=[[r.num_simulations, text, r.spread_text or "-", "; ".join(r.all_notes) or "-"]
                        for r in chosen],
            hovertemplate="%{x}<br>max QPS: %{text} req/s (median over seeds; range %{customdata[2]})"
            "<br>%{customdata[1]}<br>simulations: %{customdata[0]}<br>notes: %{customdata[3]}<extra></extra>",
        ))
    none = [r.label for r in results if r.max_qps is None]
    if none:
        fig.add_annotation(text="no QPS tried passed: " + ", ".join(none), showarrow=False, x=0.5, y=1.0,
                           xref="paper", yref="paper", yanchor="bottom")
    return _titled(fig, CHART_TITLES["max_qps"], "configuration",
                   "max QPS meeting every SLO, stable (requests/s)", barmode="group")


def replicas_figure(economics: Sequence[ConfigEconomics], family_labels: Sequence[str], target_qps: float) -> go.Figure:
    """One bar per configuration family (all options but the replica count)."""
    answers = replicas_needed_by_family(family_labels, economics).items()
    fig = go.Figure()
    for kind, extrapolated, pattern in (("measured", False, ""), ("extrapolated (linear)", True, "/")):
        chosen = [(label, a) for label, a in answers if a is not None and a.extrapolated == extrapolated]
        fig.add_trace(go.Bar(
            x=[label for label, _ in chosen], y=[a.num_replicas or 0 for _, a in chosen], name=kind,
            marker={"pattern": {"shape": pattern}},
            text=[format_number(a.num_replicas, "d", missing="none") for _, a in chosen], textposition="outside",
            customdata=[[a.note] for _, a in chosen],
            hovertemplate="%{x}<br>replicas needed: %{text}<br>%{customdata[0]}<extra>" + kind + "</extra>",
        ))
    return _titled(fig, f"{CHART_TITLES['replicas']} ({target_qps:.4g} requests/s)",
                   "configuration (all replica counts)", f"replicas for {target_qps:.4g} req/s", barmode="group")


def cost_figure(results: Sequence[ConfigResult], economics: Sequence[ConfigEconomics]) -> go.Figure:
    """Hatched, faded bars for costs computed from a max QPS that is not a converged answer."""
    fig = go.Figure(go.Bar(
        x=[r.label for r in results], y=[e.cost_per_million_output_tokens_usd for e in economics],
        marker={"color": [_color(r.index) for r in results],
                "pattern": {"shape": ["" if r.is_answer else "/" for r in results]},
                "opacity": [1.0 if r.is_answer else 0.5 for r in results]}, name="cost",
        customdata=[[e.num_gpus, r.config.gpu, e.output_tokens_per_s or 0.0,
                     "" if r.is_answer else f"<br>not an answer: {ANSWER_KINDS[r.kind]}"]
                    for r, e in zip(results, economics)],
        hovertemplate="%{x}<br>$%{y:.4g} per 1M output tokens<br>%{customdata[0]} x %{customdata[1]}"
        "<br>%{customdata[2]:.5g} output tokens/s at max QPS%{customdata[3]}<extra></extra>",
    ))
    return _titled(fig, CHART_TITLES["cost"], "configuration", "cost per 1M output tokens (USD)", showlegend=False,
                   meta=COST_META)


def pareto_figure(results: Sequence[ConfigResult], economics: Sequence[ConfigEconomics],
                  latency_label: str) -> go.Figure:
    """Every configuration with a capacity, and the front of the non-dominated ones (cheapest first)."""
    costs = [e.cost_per_million_output_tokens_usd for e in economics]
    latencies = [e.pareto_latency_ms for e in economics]
    hover = "<br>$%{x:.4g} per 1M output tokens<br>" + latency_label + ": %{y:.4g} ms<extra></extra>"
    fig = go.Figure(go.Scatter(
        x=costs, y=latencies, mode="markers+text", textposition="top center",
        text=[r.label if r.is_answer else f"{r.label} ({r.kind.replace('_', ' ')})" for r in results],
        name="configurations (open: not a converged answer, never on the front)",
        marker={"size": 11, "color": [_color(r.index) for r in results],
                "symbol": ["circle" if r.is_answer else "circle-open" for r in results]},
        hovertemplate="%{text}" + hover,
    ))
    front = sorted((c, lat, r.label) for c, lat, r, e in zip(costs, latencies, results, economics) if e.on_pareto_front)
    fig.add_trace(go.Scatter(
        x=[c for c, _, _ in front], y=[lat for _, lat, _ in front], mode="lines+markers", name="Pareto front",
        line={"color": "black", "dash": "dash"}, marker={"symbol": "circle-open", "size": 16, "color": "black"},
        text=[label for _, _, label in front], hovertemplate="Pareto front: %{text}" + hover,
    ))
    return _titled(fig, CHART_TITLES["pareto"], "cost per 1M output tokens (USD)", f"{latency_label} at max QPS (ms)",
                   hovermode="closest", meta=PARETO_META)


def capacity_figures(run: CapacityRun) -> list[go.Figure]:
    """The page's charts in order."""
    results, economics = run.results, run.economics
    return [latency_figure(results, run.slos), goodput_figure(results), max_qps_figure(results),
            replicas_figure(economics, run.family_labels, run.target_qps), cost_figure(results, economics),
            pareto_figure(results, economics, run.slos[0].label)]


# ---- the page around the charts ------------------------------------------------------------------
_EDITOR_SCRIPT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("capacity-data").textContent);
  function plotByMeta(meta) {
    var divs = document.querySelectorAll(".plotly-graph-div");
    for (var i = 0; i < divs.length; i++) {
      if (divs[i].layout && divs[i].layout.meta === meta) { return divs[i]; }
    }
    return null;
  }
  function prices() {
    var out = {};
    document.querySelectorAll("input[data-gpu]").forEach(function (input) {
      var value = parseFloat(input.value);
      // The CLI's bounds (analysis.capacity.cost): a price of 0 made every configuration on that GPU cost $0 and
      // win every comparison.
      out[input.getAttribute("data-gpu")] = isFinite(value) && value > 0 && value <= %(max_price)s ? value : null;
    });
    return out;
  }
  // Mirrors analysis.capacity.cost.cost_per_million_output_tokens_usd and pareto_front.
  function costs(price) {
    return data.configs.map(function (c) {
      var p = price[c.gpu];
      if (p === null || p === undefined || !(c.tokens_per_s > 0)) { return null; }
      return c.num_gpus * p / (c.tokens_per_s * 3600 / 1e6);
    });
  }
  function front(xs, ys) {
    var on = [];
    for (var i = 0; i < xs.length; i++) {
      if (xs[i] === null || ys[i] === null || !data.configs[i].answer) { continue; }
      var dominated = false;
      for (var j = 0; j < xs.length && !dominated; j++) {
        if (j === i || xs[j] === null || ys[j] === null || !data.configs[j].answer) { continue; }
        dominated = xs[j] <= xs[i] && ys[j] <= ys[i] && (xs[j] < xs[i] || ys[j] < ys[i]);
      }
      if (!dominated) { on.push(i); }
    }
    on.sort(function (a, b) { return xs[a] - xs[b] || ys[a] - ys[b]; });
    return on;
  }
  function redraw() {
    var xs = costs(prices());
    var ys = data.configs.map(function (c) { return c.latency_ms; });
    var costDiv = plotByMeta("%(cost_meta)s");
    var paretoDiv = plotByMeta("%(pareto_meta)s");
    if (costDiv) { Plotly.restyle(costDiv, {y: [xs]}, [0]); }
    if (paretoDiv) {
      var on = front(xs, ys);
      Plotly.restyle(paretoDiv, {x: [xs]}, [0]);
      Plotly.restyle(paretoDiv, {
        x: [on.map(function (i) { return xs[i]; })],
        y: [on.map(function (i) { return ys[i]; })],
        text: [on.map(function (i) { return data.configs[i].label; })]
      }, [1]);
    }
    document.querySelectorAll("td[data-cost-of]").forEach(function (cell) {
      var value = xs[parseInt(cell.getAttribute("data-cost-of"), 10)];
      cell.textContent = value === null ? "-" : "$" + value.toPrecision(4);
    });
  }
  window.addEventListener("load", function () {
    document.querySelectorAll("input[data-gpu]").forEach(function (input) {
      input.addEventListener("input", redraw);
    });
  });
})();
"""


def _cell(text: str, attrs: str = "") -> str:
    return f"<td{attrs}>{html_text(text)}</td>"


def _results_table(results: Sequence[ConfigResult], economics: Sequence[ConfigEconomics], slos: Sequence[SLO]) -> str:
    header = ["configuration", "max QPS (req/s)", "what it is", "range over seeds", "simulations",
              "goodput at max (req/s)"]
    header += [f"{slo.label} at max (ms)" for slo in slos]
    header += ["completions / arrivals at max", "backlog growth at max"]
    header += ["GPUs", "cost per 1M output tokens", "Pareto", "notes"]
    rows = []
    for r, e in zip(results, economics):
        point = r.point_at_max
        window = point.stability if point else {}
        cells = [
            _cell(r.label),
            _cell(r.answer_text),
            _cell(ANSWER_KINDS[r.kind].split(":")[0]),
            _cell(r.spread_text or "-"),
            _cell(str(r.num_simulations)),
            _cell(format_number(point.goodput_rps if point else None, ".4g")),
        ]
        cells += [_cell(format_number(point.slo_values_ms.get(s.key) if point else None, ".4g")) for s in slos]
        cells += [_cell(format_number(window.get("completion_ratio"), ".3f")),
                  _cell(format_number(window.get("backlog_growth_fraction"), "+.1%"))]
        cells += [
            _cell(f"{e.num_gpus} x {r.config.gpu}"),
            _cell(format_number(e.cost_per_million_output_tokens_usd, ".4g", prefix="$"), f' data-cost-of="{r.index}"'),
            _cell("yes" if e.on_pareto_front else ""),
            _cell("; ".join(r.all_notes)),
        ]
        rows.append(cells)
    return table_html(rows, header, "Capacity per configuration", raw_cells=True)


def _price_editor(gpus: Sequence[str], gpu_costs: dict[str, float]) -> str:
    rows = []
    for gpu in gpus:
        price = gpu_costs.get(gpu)
        value = "" if price is None else f"{price:g}"
        rows.append([
            _cell(gpu),
            f'<td><input type="number" min="0" step="0.05" data-gpu="{html.escape(gpu)}" value="{value}" '
            f'aria-label="USD per GPU-hour for {html.escape(gpu)}" style="width:6rem"></td>',
        ])
    return table_html(rows, ["GPU", "USD per GPU-hour (editable)"],
                      "Illustrative list prices, not quotes: edit to redraw the cost charts", raw_cells=True)


def write_capacity_report(path: Path, run: CapacityRun, title: str, subtitle: str) -> Path:
    """Write report.html; returns its path."""
    results, economics = run.results, run.economics
    data = {"configs": [{"label": r.label, "gpu": r.config.gpu.lower(), "num_gpus": e.num_gpus,
                         "tokens_per_s": e.output_tokens_per_s, "latency_ms": e.pareto_latency_ms,
                         "answer": r.is_answer}
                        for r, e in zip(results, economics)]}
    # Every "<" as \u003c, not only "</": a label with "<!--<script>" (a --model folder named so) put the page's
    # parser in the script's double-escaped state, which then swallowed this block's </script> and every chart.
    data_json = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    rows = [[label, format_number(needed.num_replicas if needed else None, "d", missing="none"),
             needed.note if needed else "-"]
            for label, needed in replicas_needed_by_family(run.family_labels, economics).items()]
    header = f'<p class="subtitle">{html_text(subtitle)}</p>\n'
    header += _results_table(results, economics, run.slos)
    header += table_html(rows, ["configuration (all replica counts)", "replicas needed", "how"],
                         f"Replicas needed for {run.target_qps:.4g} req/s")
    header += _price_editor(sorted({r.config.gpu.lower() for r in results}), run.gpu_costs)
    header += f'\n<script type="application/json" id="capacity-data">{data_json}</script>\n'
    header += "<script>" + _EDITOR_SCRIPT % {"cost_meta": COST_META, "pareto_meta": PARETO_META,
                                                "max_price": repr(float(MAX_USD_PER_GPU_HOUR))} + "</script>\n"
    return write_html(capacity_figures(run), path, title, header)
