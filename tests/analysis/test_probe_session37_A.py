"""Session 37 (A): a capacity point's cheaper bookkeeping gives exactly what the general paths give.

- steady_trace's stream is a Trace built without validating it again (Trace.of_valid_columns), its flat hash ids
  handed over: the same table, dtypes and flat ids as Trace.from_frame makes of it;
- _judge tables only the measured window's rows and reads stability off arrays (stability_of): the same as the
  whole table filtered and measure_stability over it;
- the cost model is made once per configuration (point._cost_model);
- reusing_freed_memory applies the once-per-process prompt settings first, so a simulation inside keeps its own.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

import sim.memory as memory
from analysis.capacity import point
from analysis.capacity.point import PointJob
from analysis.capacity.stability import measure_stability, stability_of
from analysis.capacity.workload import SessionLibrary, steady_trace
from analysis.slo import parse_slos
from sim.config import SimConfig
from sim.simulator import simulate
from traces.schema import Trace

TRACE = Trace.from_frame(pl.DataFrame({
    "request_id": [0, 1, 2, 3],
    "arrival_s": [0.0, 10.0, 30.0, 31.0],
    "prompt_tokens": [32, 20, 64, 300],
    "output_tokens": [5, 60, 7, 40],
    "hash_ids": [[100, 1], [100, 2], [100, 1, 3, 4], [9] * 19],
    "session_id": [7, 8, 7, 9],
}, schema_overrides={"hash_ids": pl.List(pl.Int64)}), "toy", hash_block_size=16)


@pytest.mark.parametrize(("qps", "duration_s", "seed"), [(3.0, 200.0, 1), (40.0, 30.0, 0)])
def test_stream_trace_equals_the_validated_one(qps, duration_s, seed) -> None:
    library = SessionLibrary.from_trace(TRACE)
    trace, _ = steady_trace(library, qps, duration_s, 0.25 * duration_s, "keep", seed)
    validated = Trace.from_frame(trace.requests, trace.source, trace.hash_block_size)
    assert trace.requests.schema == validated.requests.schema
    assert trace.requests.equals(validated.requests)
    assert trace.hash_block_size == validated.hash_block_size == 16
    assert "_hash_id_offsets" in trace.__dict__  # handed over, not flattened back from the column
    for mine, theirs in zip(trace._hash_id_offsets, validated._hash_id_offsets):
        assert mine.dtype == theirs.dtype == np.int64 and mine.tolist() == theirs.tolist()


def test_stability_of_arrays_is_measure_stability_of_the_table() -> None:
    arrival = np.array([0.0, 1.0, 2.0, 3.0, 4.5, 5.0, 6.0, 9.0])
    finish = [0.5, 3.5, None, 4.0, 9.5, None, 7.0, None]
    frame = pl.DataFrame({"arrival_s": arrival, "finish_s": finish}, schema={"arrival_s": pl.Float64,
                                                                           "finish_s": pl.Float64})
    finish_s = np.array([np.inf if f is None else f for f in finish])
    for start_s, end_s, tolerance in ((1.0, 8.0, 0.03), (0.0, 10.0, 0.5), (2.0, 2.0, 0.1)):
        assert stability_of(arrival, finish_s, start_s, end_s, tolerance) == measure_stability(frame, start_s, end_s,
                                                                                               tolerance)


@pytest.mark.parametrize("stop", [False, True])
def test_judge_tables_the_window_as_the_whole_table_filtered(stop) -> None:
    library = SessionLibrary.from_trace(TRACE)
    trace, window = steady_trace(library, 30.0, 40.0, 10.0, "keep", 0)
    config = SimConfig()
    # A TTFT limit below what a prefill takes: certainly missed once the window's first tenth has waited for it.
    slos = parse_slos("ttft_p90=1ms,tpot_p90=100ms" if stop else "ttft_p90=2s,tpot_p90=100ms")
    job = PointJob(config, 30.0, 0, certain_miss=stop)
    measured, stability, check, stopped_s = point._judge(trace, job, slos, window.start_s, window.end_s, 0.03,
                                                         stop_at_certain_miss=stop)
    assert (stopped_s is not None) == stop
    # The general path: the whole run tabled, stability over it, the window filtered.
    from analysis.capacity.certain_miss import CertainMiss
    watch = CertainMiss(trace.requests["arrival_s"].to_numpy(), window.start_s, window.end_s, slos) if stop else None
    result = simulate(trace, config, watch=watch)
    whole = pl.from_arrow(result.requests_table())
    end_s = window.end_s if result.stopped_s is None else min(window.end_s, result.stopped_s)
    assert result.stopped_s == stopped_s
    assert stability == measure_stability(whole, window.start_s, end_s, 0.03)
    expected = whole.filter((pl.col("arrival_s") >= window.start_s) & (pl.col("arrival_s") < window.end_s))
    assert measured.schema == expected.schema and measured.equals(expected) and measured.height > 20
    assert (measured["finish_s"].null_count() > 0) == stop  # a stopped run's requests in flight: unfinished
    assert check == point.check_slos(expected, slos) and check.meets_slos != stop


def test_cost_model_is_made_once_per_configuration() -> None:
    first = point._cost_model(SimConfig())
    assert point._cost_model(SimConfig()) is first
    assert point._cost_model(SimConfig(gpu="h100")) is not first


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("trim", pad))
        return 1


def test_reusing_freed_memory_keeps_its_settings_through_a_simulation(monkeypatch) -> None:
    libc = _FakeLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    monkeypatch.setattr(memory, "numpy_on_small_pages", lambda: True)
    memory.return_freed_memory_promptly.cache_clear()
    prompt = [("mallopt", memory._M_MMAP_THRESHOLD, memory._MMAP_THRESHOLD_BYTES),
              ("mallopt", memory._M_TRIM_THRESHOLD, 0)]
    reuse = [("mallopt", memory._M_MMAP_THRESHOLD, memory._REUSE_MMAP_THRESHOLD_BYTES),
             ("mallopt", memory._M_TRIM_THRESHOLD, memory._REUSE_TRIM_THRESHOLD_BYTES)]
    try:
        with memory.reusing_freed_memory():
            assert libc.calls == prompt + reuse  # the process's first: its prompt settings, then these
            memory.return_freed_memory_promptly()  # as simulate() asks: nothing changes
            assert libc.calls == prompt + reuse
        assert libc.calls == prompt + reuse + prompt + [("trim", 0)]
    finally:
        memory.return_freed_memory_promptly.cache_clear()
