"""Probe G (thirty-first session): a capacity point stopped early has no goodput, and the report says so instead of
drawing the goodput of the part it simulated beside the whole runs' (at 58 req/s past capacity, 36 req/s over the
part simulated against 15.8 over the whole stream)."""

from __future__ import annotations

import dataclasses

from analysis.capacity.point import PointResult
from analysis.capacity.report import _goodput_text, goodput_figure
from tests.analysis.test_cli_hostile import _point


class _Result:
    """The few fields of a ConfigResult that goodput_figure reads."""

    def __init__(self, points: list[PointResult]) -> None:
        self.label, self.index = "c0", 0
        self.all_points = points
        self.median_search = type("Search", (), {"points": points, "checks": []})()


def test_a_point_stopped_early_is_not_drawn_in_the_goodput_chart_and_says_why() -> None:
    whole = dataclasses.replace(_point(30.0, 900.0, 400.0, meets=True), goodput_rps=29.5)
    stopped = dataclasses.replace(_point(60.0, None, 4000.0), stopped_early=True, goodput_rps=None)
    figure = goodput_figure([_Result([whole, stopped])])
    drawn = [trace for trace in figure.data if trace.name == "c0"]
    assert len(drawn) == 1 and list(drawn[0].x) == [30.0] and list(drawn[0].y) == [29.5]
    assert "1 point stopped early, each missing an SLO: goodput not measured, not drawn" in figure.layout.title.text
    assert _goodput_text(stopped).startswith("not measured (stopped early")
    assert _goodput_text(whole) == "29.5 req/s"
    whole_only = goodput_figure([_Result([whole])])
    assert "stopped early" not in whole_only.layout.title.text
