"""Step-by-step schedule comparison: identical schedules, and the exact first difference."""

from __future__ import annotations

import polars as pl
import pytest

from analysis.compare.step_diff import compare_schedules
from engine.core.records import SCHEDULE_COLUMNS
from tests.analysis.frames import requests_frame, steps_frame


def schedule(num_steps: int = 5, replicas: tuple[int, ...] = (0,)) -> pl.DataFrame:
    """Steps whose schedule columns all differ from step to step, so any edit is visible."""
    rows = []
    for replica in replicas:
        for step in range(num_steps):
            row = {column: 10 * step + offset + replica for offset, column in enumerate(SCHEDULE_COLUMNS)}
            rows.append(dict(row, replica=replica, step=step, start_s=0.01 * step, duration_s=0.01, kv_usage=0.1))
    return steps_frame(rows)


def edit(steps: pl.DataFrame, replica: int, step: int, column: str, value: int) -> pl.DataFrame:
    hit = (pl.col("replica") == replica) & (pl.col("step") == step)
    return steps.with_columns(pl.when(hit).then(pl.lit(value)).otherwise(pl.col(column)).alias(column))


def requests() -> pl.DataFrame:
    return requests_frame([dict(request_id=f"q{i}", arrival_s=float(i), prompt_tokens=100, output_tokens=4,
                                cached_tokens=16 * i, num_preemptions=0) for i in range(4)])


def test_identical_schedules_ignore_timings() -> None:
    real = schedule()
    sim = real.with_columns(pl.col("duration_s") * 3, pl.col("start_s") + 1.0, pl.col("kv_usage") / 2)
    diff = compare_schedules(real, sim, requests(), requests())
    assert diff.identical
    assert diff.steps.num_compared == 5 and diff.steps.num_differing == 0
    assert diff.steps.first_difference is None
    assert diff.requests is not None and diff.requests.num_compared == 4
    assert diff.describe().startswith("schedules identical: 5 steps, 4 requests")
    assert diff.to_dict()["identical"] is True


def test_first_difference_is_reported_with_both_rows() -> None:
    real = schedule()
    sim = edit(edit(real, 0, 2, "num_decode_seqs", 999), 0, 4, "num_running", 999)
    diff = compare_schedules(real, sim)
    assert not diff.identical
    first = diff.steps.first_difference
    assert first is not None
    assert first.key == {"replica": 0, "step": 2}
    assert first.columns == ("num_decode_seqs",)
    assert first.missing_in is None
    assert first.real_row["num_decode_seqs"] == real.filter(pl.col("step") == 2)["num_decode_seqs"][0]
    assert first.sim_row["num_decode_seqs"] == 999
    assert first.real_row["num_seqs"] == first.sim_row["num_seqs"]
    assert set(first.real_row) == set(SCHEDULE_COLUMNS)
    assert diff.steps.num_differing == 2
    assert diff.steps.differing_columns == {"num_decode_seqs": 1, "num_running": 1}
    text = diff.describe()
    assert text.startswith("schedules differ")
    assert "first: replica 0, step 2, differing in num_decode_seqs" in text
    marked = [line for line in text.splitlines() if line.endswith("*")]
    assert len(marked) == 1 and marked[0].split()[0] == "num_decode_seqs" and marked[0].split()[2] == "999"


def test_first_difference_is_the_earliest_step_over_replicas() -> None:
    real = schedule(replicas=(0, 1))
    sim = edit(edit(real, 0, 3, "num_seqs", -1), 1, 1, "num_preempted", 7)
    first = compare_schedules(real, sim).steps.first_difference
    assert first is not None
    assert first.key == {"replica": 1, "step": 1}
    assert first.columns == ("num_preempted",)


def test_extra_or_missing_steps_differ() -> None:
    real = schedule(num_steps=4)
    sim = schedule(num_steps=6)
    diff = compare_schedules(real, sim)
    assert not diff.identical
    assert (diff.steps.num_real, diff.steps.num_sim, diff.steps.num_compared) == (4, 6, 4)
    assert diff.steps.num_differing == 2
    first = diff.steps.first_difference
    assert first is not None
    assert first.key == {"replica": 0, "step": 4}
    assert first.missing_in == "real" and first.real_row is None and first.sim_row is not None
    assert "step 4 exists only in sim" in diff.describe()
    assert compare_schedules(sim, real).steps.first_difference.missing_in == "sim"


def test_request_cached_tokens_and_preemptions_must_match() -> None:
    real_requests = requests()
    sim_requests = real_requests.with_columns(
        pl.when(pl.col("request_id") == "q2").then(0).otherwise(pl.col("cached_tokens")).alias("cached_tokens"),
        pl.when(pl.col("request_id") == "q3").then(1).otherwise(pl.col("num_preemptions")).alias("num_preemptions"),
    )
    diff = compare_schedules(schedule(), schedule(), real_requests, sim_requests)
    assert diff.steps.identical
    assert not diff.identical
    assert diff.requests is not None
    assert diff.requests.num_differing == 2
    assert diff.requests.differing_columns == {"cached_tokens": 1, "num_preemptions": 1}
    first = diff.requests.first_difference
    assert first is not None
    assert first.key == {"request_id": "q2"}
    assert first.columns == ("cached_tokens",)
    assert (first.real_row["cached_tokens"], first.sim_row["cached_tokens"]) == (32, 0)
    text = diff.describe()
    assert "steps identical: 5 steps" in text
    assert "requests differ: 2 of 4 (real 4, sim 4, 4 in both)" in text


def test_difference_counts_are_out_of_every_step_on_either_side() -> None:
    """Runs of other replica counts each hold steps the other lacks: the count was out of the larger side alone,
    "steps differ: 9206 of 8842" in analysis.compare --schedule of a 1- and a 2-replica run."""
    real = schedule(num_steps=5, replicas=(0,))
    sim = schedule(num_steps=3, replicas=(0, 1))
    diff = compare_schedules(real, sim)
    assert (diff.steps.num_real, diff.steps.num_sim, diff.steps.num_compared, diff.steps.num_differing) == (5, 6, 3, 5)
    assert "steps differ: 5 of 8 (real 5, sim 6, 3 in both)" in diff.describe()


def test_missing_request_differs() -> None:
    diff = compare_schedules(schedule(), schedule(), requests(), requests().head(3))
    assert diff.requests is not None
    first = diff.requests.first_difference
    assert first is not None and first.key == {"request_id": "q3"} and first.missing_in == "sim"


def test_empty_schedules_are_identical() -> None:
    diff = compare_schedules(steps_frame([]), steps_frame([]))
    assert diff.identical
    assert diff.describe() == "schedules identical: 0 steps"


def test_repeated_step_key_is_an_error() -> None:
    real = pl.concat([schedule(num_steps=2), schedule(num_steps=1)])
    with pytest.raises(ValueError, match="step=0"):
        compare_schedules(real, schedule(num_steps=2))


def test_first_request_difference_is_the_earliest_arrival() -> None:
    real = requests_frame([dict(request_id="q10", arrival_s=0.0), dict(request_id="q2", arrival_s=1.0)])
    sim = real.with_columns(pl.lit(1).alias("num_preemptions"))
    diff = compare_schedules(steps_frame([]), steps_frame([]), real, sim)
    assert diff.requests is not None and diff.requests.num_differing == 2
    assert diff.requests.first_difference.key == {"request_id": "q10"}
    later_first = real.with_columns(pl.Series("arrival_s", [1.0, 0.0]))
    diff = compare_schedules(steps_frame([]), steps_frame([]), later_first, later_first.with_columns(
        pl.lit(1).alias("num_preemptions")))
    assert diff.requests.first_difference.key == {"request_id": "q2"}
