"""sim.calibrate's decode extras: per CUDA-graph bucket, the time serving decode steps that repeat their batch take
beyond the grid's price (the grid times equal contexts; serving batches mix them), recovered exactly from step logs
whose times are known, and priced by the cost model alike one step at a time and over a run of steps."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.records import STEP_COLUMNS
from engine.core.scheduler import ScheduledBatch
from sim.calibrate import MIN_BUCKET_STEPS, calibrate, fit_decode_extras, with_sessions
from sim.limits import grid_range
from sim.profiled_cost_model import ProfiledCostModel, check_fit, find_profile, fit_profile, read_profile

STEP_INT_COLUMNS = [c.name for c in STEP_COLUMNS if c.dtype == "int64"]
PROFILE = find_profile("qwen3-0.6b", "h200")
SIZES = [1, 2, 4, 8, 16, 32, 48, 64]


def test_each_measured_bucket_gets_its_mean_and_the_others_the_nearest_measured_one():
    buckets = np.array([16] * MIN_BUCKET_STEPS + [48] * MIN_BUCKET_STEPS + [64] * (MIN_BUCKET_STEPS - 1))
    residual_s = np.concatenate([np.full(MIN_BUCKET_STEPS, 2e-5), np.linspace(3e-4, 5e-4, MIN_BUCKET_STEPS),
                                 np.full(MIN_BUCKET_STEPS - 1, 9e-3)])  # bucket 64: one step short of measured
    extras = fit_decode_extras(SIZES, buckets, residual_s)
    assert extras["batch_sizes"] == SIZES
    # 1-8 take 16's; 32 lies between 16 and 48 and takes the larger on the tie; 64 (too few steps) takes 48's.
    assert extras["extra_s"] == [2e-5] * 5 + [4e-4] * 3
    assert extras["num_steps"] == [0, 0, 0, 0, MIN_BUCKET_STEPS, 0, MIN_BUCKET_STEPS, 0]


def test_extras_are_held_at_zero_or_above_and_none_without_a_measured_bucket():
    extras = fit_decode_extras(SIZES, np.array([32] * MIN_BUCKET_STEPS), np.full(MIN_BUCKET_STEPS, -1e-3))
    assert extras["extra_s"] == [0.0] * len(SIZES)  # the grid overprices these: the decode factor takes it
    assert fit_decode_extras(SIZES, np.array([32] * 3), np.full(3, 1e-3)) is None
    assert fit_decode_extras(SIZES, np.array([], dtype=int), np.array([])) is None


def _decode_features(bs: int, context: int, continues: int, longest: int | None = None) -> dict:
    return {"num_seqs": bs, "num_prefill_seqs": 0, "num_prefill_tokens": 0, "prefill_context_tokens": 0,
            "num_decode_seqs": bs, "decode_context_tokens": bs * context, "prefill_attention_pairs": 0,
            "max_decode_context_tokens": longest or context, "continues_batch": continues}


def _run(path, steps: list[tuple[dict, float]]):
    """A GPU replay folder whose steps (features, seconds) run back to back: each period is its duration."""
    rows, start_s = [], 0.0
    for i, (f, duration_s) in enumerate(steps):
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": i, "start_s": start_s,
                     "duration_s": duration_s})
        start_s += duration_s
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}\n')
    return path


def test_calibration_recovers_the_extras_of_steps_that_repeat_their_batch(tmp_path):
    """Repeating steps at the grid's price plus 0.3 ms (33-48 rows) and 0.05 ms (9-16 rows), new-batch steps at the
    grid's price, a prefill now and then (the host factor needs one), and repeating steps with contexts beyond the grid
    at its price (left out, else they would halve 16's extra: the model extrapolates there, an error of another kind):
    the extras come back exact, the decode factor 1."""
    profile = read_profile(PROFILE)
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    beyond = grid_range(profile).longest_decode_context + 1
    steps = []
    for i in range(60):
        for f, extra_s in ((_decode_features(40, 900 + i, 1), 3e-4), (_decode_features(12, 1500 + i, 1), 5e-5),
                           (_decode_features(40, 900 + i, 0), 0.0), (_decode_features(12, 300, 1, beyond), 0.0)):
            steps.append((f, grid.predict(f, host_slowdown=1.0) + extra_s))
        prefill = {**_decode_features(0, 0, 0), "num_seqs": 1, "num_prefill_seqs": 1, "num_prefill_tokens": 256,
                   "prefill_attention_pairs": 256 * 257 // 2}
        floor, gpu = grid.eager_parts(prefill)
        steps.append((prefill, float(grid.combine(floor, gpu))))
    serving = calibrate(profile, [_run(tmp_path / "run", steps)])
    extras = dict(zip(serving["decode_extra_s"]["batch_sizes"], serving["decode_extra_s"]["extra_s"]))
    counts = dict(zip(serving["decode_extra_s"]["batch_sizes"], serving["decode_extra_s"]["num_steps"]))
    assert extras[16] == pytest.approx(5e-5, abs=1e-9) and extras[48] == pytest.approx(3e-4, abs=1e-9)
    assert extras[1] == extras[8] == extras[16] and extras[256] == extras[64] == extras[48]
    assert counts[16] == counts[48] == 60 and counts[32] == 0  # the 60 steps beyond the grid are not counted
    assert serving["decode_factor"] == pytest.approx(1.0, abs=1e-4)
    assert serving["host_factor"] == pytest.approx(1.0, abs=1e-3)

    model = ProfiledCostModel({**fit_profile({**profile, "serving": None}), "serving": serving}, "calibrated")
    for f, extra_s in ((_decode_features(40, 950, 1), 3e-4), (_decode_features(40, 950, 0), 0.0)):
        assert model.predict(f) == pytest.approx(grid.predict(f, host_slowdown=1.0) + extra_s, rel=1e-4)


def _decode_batch(bs: int, context: int, continues: int) -> ScheduledBatch:
    return ScheduledBatch(num_decode_seqs=bs, decode_context_tokens=bs * context, max_decode_context_tokens=context,
                          continues_batch=continues)


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("host_slowdown", [None, 1.3])
def test_a_run_of_decode_steps_adds_the_extra_as_each_step_does(first, host_slowdown):
    """The simulator prices a quiet window's steps at once (decode_run_s): the same floats as step by step, the extra
    on every step but a first one that does not repeat its batch."""
    profile = read_profile(PROFILE)
    fit = fit_profile({**profile, "serving": None})
    extra_s = [round(1e-5 * (i + 1), 7) for i in range(len(fit["graph_sizes"]))]
    fit["serving"] = {"host_factor": 1.1, "decode_factor": 1.05,
                      "decode_extra_s": {"batch_sizes": fit["graph_sizes"], "extra_s": extra_s}}
    model = ProfiledCostModel(fit, "extras")
    for bs in (1, 20, 48, 200):
        steps = 30
        batch = _decode_batch(bs, 700, first)
        batch.decode_context_tokens = np.arange(bs * 700, bs * 700 + bs * steps, bs, dtype=np.int64)
        batch.max_decode_context_tokens = np.arange(700, 700 + steps, dtype=np.int64)
        run_s = model.decode_run_s(batch, host_slowdown)
        one_by_one = [model.step_time_s(_decode_batch(bs, 700 + k, first if k == 0 else 1), host_slowdown)
                      for k in range(steps)]
        assert run_s.tolist() == one_by_one
        repeated = model.step_time_s(_decode_batch(bs, 700, 1), host_slowdown)
        fresh_no_plan = model.step_time_s(_decode_batch(bs, 700, 0), host_slowdown)
        bucket = next(s for s in fit["graph_sizes"] if s >= bs)
        surcharge = model._unprepared_s[bs] * (model.decode_factor if host_slowdown is None
                                               else model._decode_scale(host_slowdown))
        assert repeated - fresh_no_plan == pytest.approx(extra_s[fit["graph_sizes"].index(bucket)] - surcharge,
                                                         abs=1e-12)


def test_sessions_average_their_extras_per_bucket():
    """Per bucket, the mean of the sessions that measured it (steps counted there): a session's value at a bucket it
    never formed is its nearest measured bucket's, copied, and is left out; where none measured it, all count."""
    one = {"host_factor": 1.0, "decode_factor": 1.0,
           "decode_extra_s": {"batch_sizes": [16, 32, 48], "extra_s": [0.0, 4e-4, 4e-4], "num_steps": [10, 60, 0]}}
    two = {"host_factor": 0.9, "decode_factor": 1.0,
           "decode_extra_s": {"batch_sizes": [16, 32, 48], "extra_s": [2e-5, 2e-4, 2e-5], "num_steps": [70, 0, 0]}}
    before = {"host_factor": 1.1, "decode_factor": 1.1}  # calibrated before extras existed: none to average
    merged = with_sessions(with_sessions(before, one), two)
    assert merged["decode_extra_s"] == {"batch_sizes": [16, 32, 48], "extra_s": [1e-5, 4e-4, 2.1e-4],
                                        "num_steps": [80, 60, 0]}
    assert len(merged["sessions"]) == 3
    # Counts not recorded (a hand-written session): it counts as measured at every bucket, beside the sessions that
    # measured each one (two measured only 16 rows).
    three = {"host_factor": 1.0, "decode_factor": 1.0,
             "decode_extra_s": {"batch_sizes": [16, 32, 48], "extra_s": [4e-5, 6e-4, 6e-4]}}
    merged = with_sessions(with_sessions(None, two), three)
    assert merged["decode_extra_s"]["extra_s"] == [3e-5, 6e-4, 6e-4]


@pytest.mark.parametrize("extras, message", [
    ("0.3 ms", "expected an object written by sim.calibrate"),
    ({"batch_sizes": [32, 16], "extra_s": [0.0, 0.0]}, "expected increasing batch sizes from 1 to 65536"),
    ({"batch_sizes": [16, 32], "extra_s": [0.0]}, "expected one number of seconds from 0 to 1 per batch size (2)"),
    ({"batch_sizes": [16, 32], "extra_s": [0.0, float("nan")]}, "expected one number of seconds from 0 to 1"),
    ({"batch_sizes": [16, 32], "extra_s": [0.0, -1e-4]}, "expected one number of seconds from 0 to 1"),
    ({"extra_s": [0.0]}, "field 'fit.serving.decode_extra_s.batch_sizes' is None"),
])
def test_a_profile_with_unusable_extras_is_refused_naming_the_field(extras, message):
    profile = json.loads(PROFILE.read_text())
    serving = {"host_factor": 1.0, "decode_factor": 1.0, "decode_extra_s": extras}
    profile["fit"]["serving"] = serving
    with pytest.raises(ValueError, match="decode_extra_s") as caught:
        check_fit(profile)
    assert message in str(caught.value)
