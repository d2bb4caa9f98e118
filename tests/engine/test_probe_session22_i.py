"""Probe of the offline fidelity rule (session 22, I): where analysis.compare's schedule diff said "identical" of
schedules that differ, and where the simulator's made-up output tokens formed other batches than the engine's."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.compare.step_diff import compare_schedules
from tests.analysis.frames import requests_frame, steps_frame

BATCH_SHAPE_COLUMNS = ("prefill_attention_pairs", "max_decode_context_tokens", "continues_batch")


def _steps(**optional: list[int]) -> pl.DataFrame:
    """Three steps of equal token totals; the optional (batch composition) columns as given."""
    rows = [dict(num_seqs=2, num_prefill_seqs=2, num_prefill_tokens=20, prefill_context_tokens=20,
                 num_batched_tokens=20, num_running=2, num_kv_blocks_used=4) for _ in range(3)]
    frame = steps_frame(rows)
    return frame.with_columns(pl.Series(name, values, pl.Int64) for name, values in optional.items())


@pytest.mark.parametrize("column", BATCH_SHAPE_COLUMNS)
def test_compare_reports_steps_that_differ_only_in_their_rows(column):
    """Two prefill chunks of 10 tokens after 0 and 20 cached ones, or after 10 and 10: the same totals in every
    SCHEDULE_COLUMNS column, other batches (the cost model prices prefill_attention_pairs). analysis.compare said
    "schedules identical" though its own run tables recorded the difference."""
    real = _steps(**{c: [310, 310, 310] for c in BATCH_SHAPE_COLUMNS})
    sim = real.with_columns(pl.Series(column, [310, 999, 310], pl.Int64))
    diff = compare_schedules(real, sim)
    assert not diff.identical
    assert diff.steps.differing_columns == {column: 1}
    assert diff.steps.first_difference.key == {"replica": 0, "step": 1}
    assert diff.steps.first_difference.columns == (column,)
    assert f"differing in {column}" in diff.describe()
    # Runs recorded before these columns existed (on one side or both) still compare on the others.
    assert compare_schedules(steps_frame([{}] * 3), sim).identical is False  # the required columns differ
    assert compare_schedules(_steps(), sim).identical
    assert compare_schedules(_steps(), _steps()).identical


def test_compare_reports_another_finish_reason():
    """A request cut by max_model_len on one side and by kv_capacity on the other (same length, same cache hits) was
    "scheduled identically"."""
    real = requests_frame([dict(request_id="a", arrival_s=0.0, output_tokens=4, finish_reason="max_model_len"),
                           dict(request_id="b", arrival_s=0.0, output_tokens=4, finish_reason="length")])
    sim = real.with_columns(pl.Series("finish_reason", ["kv_capacity", "length"]))
    diff = compare_schedules(steps_frame([]), steps_frame([]), real, sim)
    assert not diff.identical
    assert diff.requests.differing_columns == {"finish_reason": 1}
    assert diff.requests.first_difference.key == {"request_id": "a"}
    assert compare_schedules(steps_frame([]), steps_frame([]), real, real).identical


def test_simulated_output_tokens_fake_no_prefix_cache_hit(tiny_qwen3, tmp_path):
    """Request b's stored prompt is request a's followed by 32 zeros. The simulator 'sampled' token 0 for every
    sequence, so b hit a's two generated blocks in the prefix cache (32 cached tokens) where the engine, whose model
    samples real tokens, hit only the prompt's block (16): the offline schedules parted at b's prefill."""
    pytest.importorskip("torch")
    from cli.engine_replay import main as engine_replay
    from cli.sim_replay import main as sim_replay
    from traces.schema import save_trace

    model_dir, _ = tiny_qwen3
    trace = tmp_path / "zeros.parquet"
    save_trace(pl.DataFrame([
        {"request_id": "a", "arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 40, "prompt_token_ids": [5] * 16},
        {"request_id": "b", "arrival_s": 0.0, "prompt_tokens": 48, "output_tokens": 4,
         "prompt_token_ids": [5] * 16 + [0] * 32},
    ]), trace)
    options = [str(trace), "--model", model_dir, "--offline", "--block-size", "16", "--max-num-seqs", "1",
               "--num-gpu-blocks", "20", "--max-model-len", "256", "--quiet"]
    assert sim_replay([*options, "--out", str(tmp_path / "sim"), "--no-report"]) == 0
    assert engine_replay([*options, "--out", str(tmp_path / "real"), "--warmup-requests", "0", "--device", "cpu",
                          "--no-report"]) == 0
    sim_requests = pl.read_parquet(tmp_path / "sim" / "requests.parquet").sort("request_id")
    real_requests = pl.read_parquet(tmp_path / "real" / "requests.parquet").sort("request_id")
    assert sim_requests["cached_tokens"].to_list() == [0, 16]
    assert real_requests["cached_tokens"].to_list() == [0, 16]
    diff = compare_schedules(pl.read_parquet(tmp_path / "real" / "steps.parquet"),
                             pl.read_parquet(tmp_path / "sim" / "steps.parquet"), real_requests, sim_requests)
    assert diff.identical, diff.describe()
