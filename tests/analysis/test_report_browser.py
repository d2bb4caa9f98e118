"""A replay's report.html in headless Chromium, with and without WebGL (tests/analysis/chromium.py).

Without WebGL the TTFT/TPOT scatter must still be drawn (as SVG), never "WebGL is not supported";
with WebGL it stays a WebGL scatter. Every chart draws its traces and the page logs no error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.metrics import summarize
from analysis.report.replay_report import CHART_TITLES, write_report
from tests.analysis.chromium import CHROMIUM, NO_WEBGL_ARGS, WEBGL_ARGS, DevTools, skip_without_chromium
from tests.analysis.frames import synthetic_requests, synthetic_steps

pytestmark = skip_without_chromium

PAGE_JS = """JSON.stringify({
  webgl: document.documentElement.getAttribute('data-webgl'),
  unsupported: document.body.innerText.indexOf('WebGL is not supported') >= 0,
  plots: Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (gd) {
    return {
      title: (gd.layout.title && gd.layout.title.text) || '',
      types: gd._fullData.map(function (t) { return t.type; }),
      svgPoints: gd.querySelectorAll('.scatterlayer .point').length,
      glCanvases: gd.querySelectorAll('canvas.gl-canvas').length,
      traces: gd.querySelectorAll('g.trace').length
    };
  })
})"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    requests = synthetic_requests(num_requests=3000, mean_output_tokens=50, num_replicas=2)
    steps = synthetic_steps(num_steps=8000, num_replicas=2)
    path = tmp_path_factory.mktemp("replay-report") / "report.html"
    return write_report(requests, steps, summarize(requests, steps), path, title="replay")


@pytest.mark.parametrize("webgl", [False, True], ids=["without-webgl", "with-webgl"])
def test_every_chart_draws_with_and_without_webgl(report: Path, tmp_path: Path, webgl: bool) -> None:
    browser = DevTools(CHROMIUM, tmp_path / "profile", WEBGL_ARGS if webgl else NO_WEBGL_ARGS)
    try:
        page = json.loads(browser.evaluate(browser.open_page(report.as_uri()), PAGE_JS))
        errors = browser.errors()
    finally:
        browser.close()
    assert errors == []
    assert not page["unsupported"]
    assert [plot["title"] for plot in page["plots"]] == list(CHART_TITLES.values())
    for plot in page["plots"]:
        assert plot["traces"] >= 1 or plot["glCanvases"] >= 1, f"{plot['title']!r} drew nothing"
    scatter = next(p for p in page["plots"] if p["title"] == CHART_TITLES["latency_by_arrival"])
    if webgl:
        assert set(scatter["types"]) == {"scattergl"} and scatter["glCanvases"] >= 1
    else:
        assert set(scatter["types"]) == {"scatter"} and scatter["svgPoints"] > 1000
    assert page["webgl"] == ("yes" if webgl else "no")  # the flags gave the browser we meant to test
