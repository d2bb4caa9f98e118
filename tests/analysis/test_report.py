"""The HTML report is self-contained, labelled and bounded in size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import polars as pl
import pytest
from plotly.offline import get_plotlyjs

from analysis.metrics import summarize
from analysis.report.figures import (
    NUM_TIME_BUCKETS,
    Series,
    histogram_figure,
    latency_cdf_figure,
    timeseries_figure,
)
from analysis.report.html_page import write_html
from analysis.report.replay_report import CHART_TITLES, report_figures, write_report
from analysis.schema import REQUESTS_SCHEMA, STEPS_SCHEMA, empty_frame
from tests.analysis.frames import requests_frame, steps_frame, synthetic_requests, synthetic_steps

PLOTLY_JS_HEAD = get_plotlyjs()[:2000]
MAX_REPORT_BYTES = 10 * 1024 * 1024


def _small_replay() -> tuple[pl.DataFrame, pl.DataFrame]:
    requests = requests_frame(
        [
            dict(arrival_s=0.0, first_scheduled_s=0.1, first_token_s=0.5, finish_s=1.5, output_tokens=3,
                 token_times_s=[0.5, 1.0, 1.5]),
            dict(replica=1, arrival_s=1.0, first_scheduled_s=1.2, first_token_s=1.4, finish_s=2.2, output_tokens=4,
                 token_times_s=[1.4, 1.6, 2.0, 2.2]),
            dict(arrival_s=2.0, finish_s=2.0, finish_reason="rejected", reject_reason="kv_full"),
        ]
    )
    steps = steps_frame(
        [
            dict(replica=replica, start_s=0.5 * index, duration_s=0.5, num_running=index, num_waiting=3 - index,
                 kv_usage=0.1 * index, num_prefill_tokens=16, num_decode_seqs=index, num_batched_tokens=16 + index)
            for replica in (0, 1)
            for index in range(4)
        ]
    )
    return requests, steps


def _assert_self_contained(text: str) -> None:
    assert text.count(PLOTLY_JS_HEAD) == 1  # plotly.js inlined exactly once
    assert '<script src="http' not in text
    assert "<script src=" not in text


def test_report_is_self_contained_and_has_every_chart(tmp_path: Path) -> None:
    requests, steps = _small_replay()
    summary = summarize(requests, steps)
    path = write_report(requests, steps, summary, tmp_path / "out" / "report.html", title="Replay <test>",
                        subtitle="cost model: roofline-estimate")
    assert path == tmp_path / "out" / "report.html"
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    _assert_self_contained(text)
    assert "Replay &lt;test&gt;" in text
    assert "cost model: roofline-estimate" in text
    assert '<table class="summary">' in text
    for chart_title in CHART_TITLES.values():
        assert chart_title in text
    assert text.count('class="plotly-graph-div"') == len(CHART_TITLES)


def test_report_figures_label_axes_and_split_replicas() -> None:
    requests, steps = _small_replay()
    figures = report_figures(requests, steps)
    assert [fig.layout.title.text for fig in figures] == list(CHART_TITLES.values())
    for fig in figures:
        axes = [name for name in fig.layout if name.startswith(("xaxis", "yaxis"))]
        for name in axes:
            if name.startswith("yaxis"):
                assert fig.layout[name].title.text, (fig.layout.title.text, name)
        assert any(fig.layout[name].title.text for name in axes if name.startswith("xaxis"))
        for trace in fig.data:
            assert trace.hovertemplate and trace.name
    queues = figures[list(CHART_TITLES).index("queues")]
    assert sorted({trace.name for trace in queues.data}) == ["replica 0", "replica 1"]
    assert len(queues.data) == 4  # two panels x two replicas
    assert queues.layout.yaxis.title.text == "running sequences"
    assert queues.layout.xaxis2.title.text == "step start time (s)"
    kv = figures[list(CHART_TITLES).index("kv_usage")]
    assert kv.layout.yaxis.title.text == "KV cache usage (%)"
    assert max(max(trace.y) for trace in kv.data) == pytest.approx(30.0)


def test_report_with_empty_and_rejected_only_inputs(tmp_path: Path) -> None:
    empty = summarize(empty_frame(REQUESTS_SCHEMA), empty_frame(STEPS_SCHEMA))
    path = write_report(empty_frame(REQUESTS_SCHEMA), None, empty, tmp_path / "empty.html", title="empty")
    _assert_self_contained(path.read_text(encoding="utf-8"))
    rejected = requests_frame([dict(arrival_s=0.0, finish_reason="rejected", reject_reason="kv_full")])
    path = write_report(rejected, empty_frame(STEPS_SCHEMA), summarize(rejected, None), tmp_path / "r.html", "r")
    assert "no data" in path.read_text(encoding="utf-8")


def test_report_size_is_bounded_for_large_runs(tmp_path: Path) -> None:
    requests = synthetic_requests(num_requests=20_000, mean_output_tokens=50, num_replicas=4)
    steps = synthetic_steps(num_steps=100_000, num_replicas=4)
    path = write_report(requests, steps, summarize(requests, steps), tmp_path / "big.html", title="big")
    size_bytes = path.stat().st_size
    assert size_bytes < MAX_REPORT_BYTES
    figures = report_figures(requests, steps)
    queues = figures[list(CHART_TITLES).index("queues")]
    assert sum(len(trace.x) for trace in queues.data) < 20_000
    kv = figures[list(CHART_TITLES).index("kv_usage")]
    assert max(max(trace.y) for trace in kv.data) == pytest.approx(steps["kv_usage"].max() * 100)
    # Long series are drawn as a mean (solid) and a max (dotted) per time bucket, one legend entry per replica.
    assert len(queues.data) == 2 * 4 * 2 and {len(trace.x) for trace in queues.data} == {NUM_TIME_BUCKETS}
    assert [trace.line.dash for trace in queues.data[:2]] == [None, "dot"]
    assert sum(trace.showlegend for trace in queues.data) == 4
    histogram = figures[list(CHART_TITLES).index("batch_histogram")]
    assert all((trace.y > 0).sum() >= 10 for trace in histogram.data)  # a shape, not one bar


def test_generic_builders_and_page(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    cdf = latency_cdf_figure({"TTFT": {"sim": rng.uniform(size=100), "real": rng.uniform(size=50)},
                              "TPOT": np.array([])}, title="sim vs real")
    assert {trace.name for trace in cdf.data} == {"sim", "real"}
    assert cdf.layout.xaxis.title.text == "TTFT (ms)"
    assert sum(trace.showlegend for trace in cdf.data) == 2
    lines = timeseries_figure({"load (req/s)": [Series("a", np.arange(5.0), np.arange(5.0))]}, title="load",
                              x_title="offered rate (req/s)")
    assert lines.layout.xaxis.title.text == "offered rate (req/s)"
    hist = histogram_figure({"tokens": rng.integers(0, 100, 1000)}, title="histogram")
    assert sum(hist.data[0].y) == 1000
    with pytest.raises(ValueError):
        timeseries_figure({}, title="bad", mode="bars")
    path = write_html([cdf, lines, hist, go.Figure()], tmp_path / "page.html", "Compare", "<p>header</p>")
    text = path.read_text(encoding="utf-8")
    _assert_self_contained(text)
    assert "<p>header</p>" in text and "sim vs real" in text
    assert write_html([], tmp_path / "none.html", "nothing").exists()
