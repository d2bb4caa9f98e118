"""Session 36, helper A: steps.parquet written by polars (snappy, null counts, no min/max statistics) reads back as the
very table the run built, whatever its shape: a simulated run's step log, an empty one, one with extra columns."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from analysis.runs import STEP_PARQUET_OPTIONS, write_run
from engine.core.records import StepLog
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import make_trace


def _write(tmp_path, steps: pa.Table, requests: pa.Table) -> pq.ParquetFile:
    write_run(tmp_path, requests, steps, {"cost_model": "test", "trace": "t", "config": {}})
    return pq.ParquetFile(tmp_path / "steps.parquet")


def _simulated(num_replicas: int = 1):
    trace = make_trace([300, 40, 900, 12, 64], [30, 200, 5, 90, 1], arrival_s=[0.0, 0.01, 0.02, 0.5, 0.9])
    return simulate(trace, SimConfig(num_replicas=num_replicas))


def test_a_simulated_step_log_reads_back_equal_with_its_schema(tmp_path):
    result = _simulated(num_replicas=2)
    steps = result.steps_table()
    assert steps.num_rows > 50 and result.num_fast_forward_steps > 0  # quiet runs expanded into rows
    parquet = _write(tmp_path, steps, result.requests_table())
    back = parquet.read()
    assert back.equals(steps)
    assert back.schema.equals(steps.schema)  # every column int64 or float64, nullable, as built
    assert [f.nullable for f in back.schema] == [True] * len(steps.schema)
    assert pq.read_table(tmp_path / "steps.parquet").equals(steps)


def test_the_file_has_null_counts_but_no_min_max_statistics(tmp_path):
    result = _simulated()
    steps = result.steps_table()
    metadata = _write(tmp_path, steps, result.requests_table()).metadata
    assert metadata.num_rows == steps.num_rows
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for i in range(row_group.num_columns):
            column = row_group.column(i)
            assert column.compression == "SNAPPY"
            assert column.statistics is not None
            assert not column.statistics.has_min_max
            assert column.statistics.null_count == 0
    assert STEP_PARQUET_OPTIONS["statistics"] == {"min": False, "max": False, "distinct_count": False,
                                                  "null_count": True}


def test_an_empty_step_log_reads_back_equal(tmp_path):
    steps = StepLog().to_arrow()
    assert steps.num_rows == 0
    back = _write(tmp_path, steps, _simulated().requests_table()).read()
    assert back.num_rows == 0
    assert back.equals(steps)


def test_extra_float_columns_and_repeated_values_survive(tmp_path):
    # engine.replay appends host and GPU times as float64 columns; few-valued columns get dictionary pages.
    result = _simulated()
    steps = result.steps_table()
    n = steps.num_rows
    steps = steps.append_column("host_prepare_ms", pa.array([0.25 * (i % 3) for i in range(n)], pa.float64()))
    back = _write(tmp_path, steps, result.requests_table()).read()
    assert back.column_names[-1] == "host_prepare_ms"
    assert back.column("host_prepare_ms").to_pylist() == [0.25 * (i % 3) for i in range(n)]
    assert back.equals(steps)
