"""Steady streams for capacity (analysis.capacity.workload) and their stability (analysis.capacity.stability)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analysis.capacity.stability import measure_stability
from analysis.capacity.workload import SessionLibrary, StreamTooLong, WorkloadParams, steady_trace
from traces.schema import Trace

# Session 7: two turns 30 s apart, the second extending the first's blocks; session 8: one turn. Block 100 is
# a "system prompt" both sessions start with.
TRACE = Trace.from_frame(pl.DataFrame({
    "request_id": [0, 1, 2],
    "arrival_s": [0.0, 10.0, 30.0],
    "prompt_tokens": [32, 20, 64],
    "output_tokens": [5, 6, 7],
    "hash_ids": [[100, 1], [100, 2], [100, 1, 3, 4]],
    "session_id": [7, 8, 7],
}, schema_overrides={"hash_ids": pl.List(pl.Int64)}), "toy", hash_block_size=16)


def _sessions(trace: Trace) -> dict[int, pl.DataFrame]:
    return {key[0]: frame for key, frame in trace.requests.group_by("session_id", maintain_order=True)}


def test_library_cuts_the_trace_into_sessions() -> None:
    library = SessionLibrary.from_trace(TRACE)
    assert [rows.tolist() for rows in library.session_rows] == [[0, 2], [1]]
    assert library.offsets_s.tolist() == [0.0, 0.0, 30.0]
    assert library.requests_per_session == 1.5 and library.trace_qps == pytest.approx(2 / 30)
    assert library.longest_session_s == 30.0
    assert library.start_gaps.tolist() == [1.0]  # one gap between the two starts, normalised


def test_stream_keeps_sessions_think_times_and_gives_fresh_ids() -> None:
    library = SessionLibrary.from_trace(TRACE)
    trace, window = steady_trace(library, qps=3.0, duration_s=200.0, warmup_s=50.0, think_times="keep", seed=1)
    assert (window.start_s, window.end_s) == (50.0, 200.0)
    frame = trace.requests
    assert frame["request_id"].to_list() == list(range(len(frame)))
    arrivals = frame["arrival_s"].to_numpy()
    assert arrivals[0] >= 0 and arrivals[-1] < 200.0 and np.all(np.diff(arrivals) >= 0)
    private_ids_seen: set[int] = set()
    two_turn = 0
    system_block = frame["hash_ids"][0][0]
    for frame_of_session in _sessions(trace).values():
        ids = frame_of_session["hash_ids"].to_list()
        assert all(session_ids[0] == system_block for session_ids in ids)  # the shared block stays shared
        private = {i for session_ids in ids for i in session_ids[1:]}
        assert not private & private_ids_seen  # copies of one session share no private block
        private_ids_seen |= private
        if len(frame_of_session) == 2:  # both turns of session 7: 30 s apart, the second extends the first
            two_turn += 1
            first, second = frame_of_session.rows(named=True)
            assert second["arrival_s"] - first["arrival_s"] == pytest.approx(30.0)
            assert second["hash_ids"][:2] == first["hash_ids"] and second["prompt_tokens"] == 64
    assert two_turn > 50
    assert len(frame) / 200.0 == pytest.approx(3.0, rel=0.15)


def test_stream_hash_ids_copy_private_blocks_per_session_copy() -> None:
    library = SessionLibrary.from_trace(TRACE)
    # Ids renumbered densely (1, 2, 3, 4, 100 -> 0 .. 4); 100 (4 now) is shared by both sessions, the rest private.
    assert [ids.tolist() for ids in library.hash_ids] == [[4, 0], [4, 1], [4, 0, 2, 3]]
    column = library.stream_hash_ids(np.array([2, 1, 0, 2]), np.array([0, 5, 0, 1]))
    # A private id of copy c becomes id + (c + 1) * 5; the shared one stays 4.
    assert column.dtype == pl.List(pl.Int64)
    assert column.to_list() == [[4, 5, 7, 8], [4, 31], [4, 5], [4, 10, 12, 13]]
    assert library.stream_hash_ids(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).to_list() == []
    # Block 1 (0 now) is in both turns of session 7, yet private: shared means used by two sessions.
    assert library.shared_hash_ids.tolist() == [False, False, False, False, True]


def test_stream_hash_ids_without_shared_blocks_are_all_made_fresh() -> None:
    one_session = Trace.from_frame(TRACE.requests.filter(pl.col("session_id") == 7), "toy", hash_block_size=16)
    library = SessionLibrary.from_trace(one_session)
    # Ids 1, 3, 4, 100 -> 0 .. 3, none shared: every id of copy c becomes id + (c + 1) * 4.
    assert [ids.tolist() for ids in library.hash_ids] == [[3, 0], [3, 0, 1, 2]]
    assert not library.shared_hash_ids.any()
    column = library.stream_hash_ids(np.array([1, 0, 1]), np.array([0, 2, 3]))
    assert column.to_list() == [[7, 4, 5, 6], [15, 12], [19, 16, 17, 18]]


def test_scaled_think_times_shrink_with_the_load_and_seeds_are_reproducible() -> None:
    library = SessionLibrary.from_trace(TRACE)
    trace, _ = steady_trace(library, qps=2.0, duration_s=100.0, warmup_s=0.0, think_times="scale", seed=3)
    scale = library.trace_qps / 2.0
    gaps = [frame["arrival_s"].diff()[1] for frame in _sessions(trace).values() if len(frame) == 2]
    assert gaps and all(gap == pytest.approx(30.0 * scale) for gap in gaps)
    again, _ = steady_trace(library, qps=2.0, duration_s=100.0, warmup_s=0.0, think_times="scale", seed=3)
    other, _ = steady_trace(library, qps=2.0, duration_s=100.0, warmup_s=0.0, think_times="scale", seed=4)
    assert again.requests.equals(trace.requests) and not other.requests.equals(trace.requests)


def test_rate_matches_on_a_single_turn_trace_without_ids() -> None:
    rng = np.random.default_rng(0)
    frame = pl.DataFrame({"request_id": np.arange(200), "arrival_s": np.cumsum(rng.exponential(0.5, 200)),
                          "prompt_tokens": np.full(200, 10), "output_tokens": np.full(200, 5)})
    library = SessionLibrary.from_trace(Trace.from_frame(frame, "poisson"))
    assert library.num_sessions == 200 and library.hash_ids is None
    trace, _ = steady_trace(library, qps=50.0, duration_s=400.0, warmup_s=0.0, think_times="keep", seed=0)
    assert len(trace) / 400.0 == pytest.approx(50.0, rel=0.03) and "hash_ids" not in trace.requests.columns


def test_prompt_token_ids_become_chained_block_ids() -> None:
    tokens = [list(range(40)), list(range(32)) + [9] * 8, [5] * 20]
    frame = pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [40, 40, 20],
                          "output_tokens": [1, 1, 1], "prompt_token_ids": tokens})
    library = SessionLibrary.from_trace(Trace.from_frame(frame, "ids"))
    assert library.hash_block_size == 16
    ids = [row.tolist() for row in library.hash_ids]
    assert ids[0][:2] == ids[1][:2] and ids[0][2] != ids[1][2]  # 32 shared tokens: two shared blocks
    assert not set(ids[2]) & set(ids[0])
    assert library.shared_hash_ids[ids[0][:2]].all() and not library.shared_hash_ids[ids[2]].any()


def test_workload_durations_and_errors() -> None:
    params = WorkloadParams(min_duration_s=100.0, min_requests=1000)
    assert params.duration_s(5.0) == 200.0 and params.duration_s(50.0) == 100.0
    assert params.duration_s(50.0, scale=2.0) == 200.0
    with pytest.raises(ValueError, match="--think-times must be one of keep, scale"):
        WorkloadParams(think_times="fast")
    with pytest.raises(ValueError, match=r"--warmup-fraction must be in \[0, 1\)"):
        WorkloadParams(warmup_fraction=1.0)


def test_a_stream_beyond_what_one_simulation_takes_is_refused() -> None:
    """--min-duration-s 1e308 or --qps-max 1e308 raised OverflowError drawing the stream; 2**62 requests too."""
    with pytest.raises(ValueError, match="--min-requests must be from 0 to 10,000,000"):
        WorkloadParams(min_requests=2**62)
    with pytest.raises(ValueError, match="holds about 4.8e\\+08 requests, more than the 10,000,000"):
        WorkloadParams().check_stream_size(1e6, scale=2.0)
    WorkloadParams().check_stream_size(1e3, scale=2.0)  # 480,000 requests: fine
    with pytest.raises(StreamTooLong, match="more than one simulation takes"):
        steady_trace(SessionLibrary.from_trace(TRACE), 1e6, 1e308, 0.0, "keep", seed=0)


def _requests(arrivals: np.ndarray, finishes: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame({"arrival_s": arrivals, "finish_s": finishes})


def test_stability_of_a_system_that_keeps_up_and_one_that_does_not() -> None:
    arrivals = np.arange(0.0, 100.0, 0.5)  # 2 per second
    kept_up = measure_stability(_requests(arrivals, arrivals + 1.0), 20.0, 100.0, tolerance=0.03)
    assert kept_up.num_arrived == 160 and kept_up.num_completed == 160 and kept_up.completion_ratio == 1.0
    assert kept_up.backlog_growth_rps == pytest.approx(0.0, abs=1e-9) and kept_up.stable
    assert kept_up.backlog_start == kept_up.backlog_end == 2.0
    # Served at 1.6 per second: the backlog grows at 0.4 per second, 20 % of arrivals.
    served = np.arange(len(arrivals)) / 1.6 + 0.5
    overloaded = measure_stability(_requests(arrivals, served), 20.0, 100.0, tolerance=0.03)
    assert overloaded.num_completed == 128 and overloaded.completion_ratio == 0.8
    assert overloaded.backlog_growth_fraction == pytest.approx(0.2, abs=0.01) and not overloaded.stable
    unfinished = measure_stability(_requests(arrivals, np.full(len(arrivals), np.nan)), 20.0, 100.0, 0.03)
    assert unfinished.num_completed == 0 and not unfinished.stable
