"""``analysis.runs.write_tables``: the files hold every column; what it returns holds only the step columns its
readers ask for, and the summary, report and warnings read nothing else."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.metrics import SUMMARY_STEP_INPUTS, summarize
from analysis.report.panels import REPORT_STEP_INPUTS
from analysis.runs import with_latency_columns, write_tables
from engine.core.records import STEP_COLUMNS
from sim.config import SimConfig
from sim.limits import WARNING_STEP_INPUTS, queued_replicas, run_warnings
from sim.simulator import simulate
from tests.sim.helpers import make_trace

N = 150  # prompts of 8,000 tokens at 100 req/s: queues that grow, quiet decode runs between the prefills
TRACE = make_trace([8000] * N, [40] * N, [i / 100 for i in range(N)])


@pytest.fixture(scope="module")
def result():
    return simulate(TRACE, SimConfig(num_replicas=2))


def test_the_files_hold_every_column_and_the_frames_the_columns_asked(tmp_path, result) -> None:
    requests, steps = write_tables(tmp_path, result.requests_table(), result.steps_table(),
                                   ("kv_usage", "no_such_column", "replica", "kv_usage"))
    assert steps.columns == ["kv_usage", "replica"]
    written = pl.read_parquet(tmp_path / "steps.parquet")
    assert written.columns == [c.name for c in STEP_COLUMNS]
    assert written.select("kv_usage", "replica").equals(steps)
    assert requests.equals(with_latency_columns(pl.from_arrow(result.requests_table())))
    assert pl.read_parquet(tmp_path / "requests.parquet").equals(requests)


def test_the_default_columns_are_the_summarys_and_the_reports(tmp_path, result) -> None:
    _, steps = write_tables(tmp_path, result.requests_table(), result.steps_table())
    assert set(steps.columns) == {*SUMMARY_STEP_INPUTS, *REPORT_STEP_INPUTS}
    assert len(steps.columns) == 10


def test_summary_report_and_warnings_read_only_their_columns(tmp_path, result) -> None:
    from analysis.report.replay_report import report_figures

    requests = with_latency_columns(pl.from_arrow(result.requests_table()))
    steps = pl.from_arrow(result.steps_table())
    assert summarize(requests, steps.select(SUMMARY_STEP_INPUTS)) == summarize(requests, steps)
    narrow = [figure.to_json() for figure in report_figures(requests, steps.select(REPORT_STEP_INPUTS))]
    assert narrow == [figure.to_json() for figure in report_figures(requests, steps)]
    config = result.config
    arrivals_s, replicas = requests["arrival_s"].to_numpy(), queued_replicas(requests)
    warnings = run_warnings(config, config.model_shape, TRACE.requests, steps, arrivals_s, replicas)
    assert [w["code"] for w in warnings] == ["past_saturation"]
    assert run_warnings(config, config.model_shape, TRACE.requests, steps.select(WARNING_STEP_INPUTS), arrivals_s,
                        replicas) == warnings


def test_grid_warnings_read_only_their_columns() -> None:
    """A run past the profile's grid (20k-token prompts: decode contexts beyond its 16k) warns the same from the
    warnings' columns alone: the saturation case above reads none of the grid's."""
    n = 4
    trace = make_trace([20_000] * n, [40] * n, [i * 10.0 for i in range(n)])
    run = simulate(trace, SimConfig())
    steps = pl.from_arrow(run.steps_table())
    requests = with_latency_columns(pl.from_arrow(run.requests_table()))
    config = run.config
    arrivals_s, replicas = requests["arrival_s"].to_numpy(), queued_replicas(requests)
    warnings = run_warnings(config, config.model_shape, trace.requests, steps, arrivals_s, replicas)
    assert "beyond_grid_decode_context" in {w["code"] for w in warnings}
    assert run_warnings(config, config.model_shape, trace.requests, steps.select(WARNING_STEP_INPUTS), arrivals_s,
                        replicas) == warnings
