"""report.html of a capacity sweep, rendered in headless Chromium (tests/analysis/chromium.py): every
chart drawn, no page errors, and the editable $/GPU-hour table redraws the cost chart. Skipped when
no Chromium binary is installed (CI installs Debian's ``chromium``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.capacity.cli import main
from tests.analysis.chromium import CHROMIUM, DevTools, skip_without_chromium

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "traces" / "sharegpt.parquet")
pytestmark = skip_without_chromium


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("capacity-report")
    argv = [TRACE, "--limit", "150", "--model", "qwen3-8b", "--gpu", "l40s", "--replicas", "1,2",
            "--cost-model", "roofline", "--slo", "ttft_p90=500ms,tpot_p90=50ms", "--tolerance", "0.15",
            "--max-iterations", "6", "--target-qps", "20", "--jobs", "1", "--quiet", "--out", str(out),
            "--min-duration-s", "60", "--min-requests", "150", "--no-duration-check"]
    assert main(argv) == 0
    return out / "report.html"


PLOTS_JS = """JSON.stringify(Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (gd) {
  return {
    title: (gd.layout.title && gd.layout.title.text) || '',
    svgs: gd.querySelectorAll('.main-svg').length,
    traces: gd.querySelectorAll('g.trace').length,
    axisTitles: Array.from(gd.querySelectorAll('.g-xtitle text, .g-ytitle text, \
[class^="g-x"][class$="title"] text, [class^="g-y"][class$="title"] text')).map(function (t) { return t.textContent; }),
    legendItems: gd.querySelectorAll('.legend .traces').length
  };
}))"""

EDIT_PRICE_JS = """(function () {
  var input = document.querySelector('input[data-gpu="l40s"]');
  function plot(meta) {
    return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(function (gd) {
      return gd.layout.meta === meta;
    })[0];
  }
  var cost = plot('capacity-cost'), pareto = plot('capacity-pareto');
  var before = cost.data[0].y.slice(), paretoBefore = pareto.data[0].x.slice();
  input.value = String(parseFloat(input.value) * 2);
  input.dispatchEvent(new Event('input'));
  var cells = Array.from(document.querySelectorAll('td[data-cost-of]')).map(function (c) { return c.textContent; });
  return JSON.stringify({before: before, after: cost.data[0].y, paretoBefore: paretoBefore,
                         paretoAfter: pareto.data[0].x, cells: cells});
})()"""


PRICE_CELLS_JS = """(function (price) {
  var input = document.querySelector('input[data-gpu="l40s"]');
  input.value = price;
  input.dispatchEvent(new Event('input'));
  return JSON.stringify(Array.from(document.querySelectorAll('td[data-cost-of]')).map(function (c) {
    return c.textContent;
  }));
})"""


def test_the_price_editor_takes_the_prices_the_command_line_takes(report: Path, tmp_path: Path) -> None:
    """A price of 0 (every configuration free, the cheapest) or past the CLI's $10,000 an hour is no price: "-"."""
    browser = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        session = browser.open_page(report.as_uri())
        cells = {price: json.loads(browser.evaluate(session, f"{PRICE_CELLS_JS}({price!r})"))
                 for price in ("0", "-1", "20000", "1.25", "10000")}
    finally:
        browser.close()
    for price in ("0", "-1", "20000"):
        assert cells[price] and set(cells[price]) == {"-"}, (price, cells[price])
    for price in ("1.25", "10000"):
        assert all(cell.startswith("$") for cell in cells[price]), (price, cells[price])


def test_every_chart_renders_without_errors_and_prices_are_editable(report: Path, tmp_path: Path) -> None:
    num_figures = report.read_text().count('class="plotly-graph-div"')
    assert num_figures == 6
    browser = DevTools(CHROMIUM, tmp_path / "profile")
    try:
        session = browser.open_page(report.as_uri())
        plots = json.loads(browser.evaluate(session, PLOTS_JS))
        edited = json.loads(browser.evaluate(session, EDIT_PRICE_JS))
        errors = browser.errors()
    finally:
        browser.close()
    assert errors == []
    assert len(plots) == num_figures
    for plot in plots:
        assert plot["svgs"] >= 1, f"{plot['title']!r} was not drawn"
        assert plot["traces"] >= 1, f"{plot['title']!r} has no drawn traces"
        assert plot["axisTitles"] and all(plot["axisTitles"]), f"{plot['title']!r} lacks axis titles"
    latency = next(p for p in plots if p["title"].startswith("Latency versus offered load"))
    assert latency["legendItems"] >= 3  # two configurations and the SLO limit
    assert edited["after"] == pytest.approx([2 * cost for cost in edited["before"]])
    assert edited["paretoAfter"] == pytest.approx([2 * cost for cost in edited["paretoBefore"]])
    assert all(cell.startswith("$") for cell in edited["cells"])
