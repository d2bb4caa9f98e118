"""What the capacity report draws for answers and for bounds: a bound is never drawn as an answer."""

from __future__ import annotations

from analysis.capacity.cost import assess
from analysis.capacity.report import cost_figure, max_qps_figure, pareto_figure
from sim.config import SimConfig
from tests.analysis.capacity_results import config_result


def _results():
    return [config_result(0, SimConfig(num_replicas=1), 10.0, ttft_p90_ms=500.0),
            config_result(1, SimConfig(num_replicas=2), 25.0, ttft_p90_ms=400.0, bound=True)]


def test_max_qps_bars_hatch_and_label_a_lower_bound() -> None:
    fig = max_qps_figure(_results())
    answer, bound = fig.data
    assert (answer.name, list(answer.x), list(answer.text), answer.marker.pattern.shape) == (
        "converged", ["c0"], ["10"], "")
    assert (bound.name, list(bound.x), list(bound.text), bound.marker.pattern.shape) == (
        "lower bound", ["c1"], [">=25"], "/")
    assert bound.marker.opacity == 0.5


def test_cost_and_pareto_mark_what_is_not_an_answer() -> None:
    results = _results()
    economics = assess(results, {"h200": 3.5}, target_qps=40.0, pareto_key="ttft_p90")
    cost = cost_figure(results, economics).data[0]
    assert list(cost.marker.pattern.shape) == ["", "/"] and list(cost.marker.opacity) == [1.0, 0.5]
    assert "not an answer: lower bound" in cost.customdata[1][3]
    points, front = pareto_figure(results, economics, "TTFT p90").data
    assert list(points.marker.symbol) == ["circle", "circle-open"]
    assert list(points.text) == ["c0", "c1 (lower bound)"]
    assert list(front.text) == ["c0"]  # the bound is cheaper and faster, but never on the front


def test_a_miss_without_a_value_is_drawn_above_the_panel() -> None:
    """A load that missed with its statistic unbounded (a run stopped early on a certain miss: slo_values_ms None)
    was left out of the latency chart, so a search's failures at those loads did not show (probe J, session 26)."""
    import dataclasses

    from analysis.capacity.report import latency_figure
    from analysis.capacity.sweep import ConfigResult, SeedSearch
    from analysis.slo import parse_slos
    from tests.analysis.capacity_results import point_result

    passed = point_result(10.0, 400.0)
    missed = dataclasses.replace(point_result(20.0, 0.0), feasible=False, meets_slos=False, stopped_early=True,
                                 slo_values_ms={"ttft_p90": None})
    no_samples = dataclasses.replace(point_result(5.0, 0.0), slo_values_ms={"ttft_p90": None})  # met, nothing to draw
    search = SeedSearch(0, config_result(0, SimConfig(), 10.0).searches[0].outcome, (passed, missed, no_samples), ())
    result = ConfigResult(0, SimConfig(), "c0", (search,))
    points = latency_figure([result], parse_slos("ttft_p90=1s")).data[0]
    assert list(points.x) == [5.0, 10.0, 20.0]
    assert list(points.y) == [None, 400.0, 1500.0]  # 1.5 x the largest of the panel (the 1,000 ms limit)
    assert [row[3] for row in points.customdata] == ["no samples", "400 ms",
                                                     "above 1000 ms, unbounded (drawn at the top)"]
