"""StepLog.to_arrow expands quiet runs into the rows record() would have written, and requests_to_arrow reads
token times kept as runs of a shared buffer (the simulator's StepEnds) as it reads arrays: checked here against a
plain row-by-row expansion, on logs that start and end with runs, hold runs back to back and runs of one step."""

from __future__ import annotations

import random
from array import array
from types import SimpleNamespace

import numpy as np
import pytest

from engine.core.records import BATCH_COLUMNS, STEP_COLUMNS, StepLog, requests_to_arrow

_NAMES = [c.name for c in STEP_COLUMNS]


def _recorded(rng: random.Random, log: StepLog, rows: list[dict], clock: list[float]) -> None:
    batch = SimpleNamespace(**{name: rng.randrange(0, 500) for name in BATCH_COLUMNS},
                            preempted=[None] * rng.randrange(0, 3))
    start, duration = clock[0], rng.uniform(0.001, 0.05)
    engine = {"num_running": rng.randrange(0, 64), "num_waiting": rng.randrange(0, 9),
              "num_kv_blocks_used": rng.randrange(0, 100), "num_finished": rng.randrange(0, 4)}
    ran_ahead = rng.randrange(2)
    log.record(batch, start, duration, engine["num_running"], engine["num_waiting"], engine["num_kv_blocks_used"],
               engine["num_finished"], ran_ahead)
    rows.append({**{name: getattr(batch, name) for name in BATCH_COLUMNS}, **engine,
                 "num_preempted": len(batch.preempted), "start_s": start, "duration_s": duration,
                 "ran_ahead": ran_ahead})
    clock[0] = start + duration


def _quiet(rng: random.Random, log: StepLog, rows: list[dict], clock: list[float]) -> None:
    length = rng.choice([1, 2, rng.randrange(3, 40)])
    seqs, context, longest = rng.randrange(1, 64), rng.randrange(100, 10_000), rng.randrange(10, 4_000)
    finished_last, waiting_last, continues_first = rng.randrange(0, seqs + 1), rng.randrange(0, 3), rng.randrange(2)
    start = clock[0] + rng.choice([0.0, rng.uniform(0.0, 0.5)])  # a run may start after an idle gap
    ends = np.cumsum([rng.uniform(0.001, 0.03) for _ in range(length)]) + start
    blocks = array("q", (rng.randrange(0, 100) for _ in range(length)))
    ran_ahead = rng.randrange(2)  # whether the runner launches a step that repeats its batch ahead
    # As stretches of one count (the step log's form): a pair for each step, or one for the whole run.
    stretches = [(0, blocks[0])] if rng.randrange(4) == 0 else list(enumerate(blocks))
    if len(stretches) == 1:
        blocks = array("q", [blocks[0]]) * length
    log.extend_quiet(seqs, context, longest, stretches, start, ends, finished_last, waiting_last, continues_first,
                     ran_ahead)
    for k in range(length):
        last = k == length - 1
        step_start = start if k == 0 else float(ends[k - 1])
        rows.append({
            "num_seqs": seqs, "num_prefill_seqs": 0, "num_prefill_tokens": 0, "prefill_context_tokens": 0,
            "num_decode_seqs": seqs, "decode_context_tokens": context + seqs * k, "num_batched_tokens": seqs,
            "num_running": seqs - (finished_last if last else 0), "num_waiting": waiting_last if last else 0,
            "num_kv_blocks_used": blocks[k], "num_preempted": 0, "num_finished": finished_last if last else 0,
            "prefill_attention_pairs": 0, "max_decode_context_tokens": longest + k,
            "continues_batch": continues_first if k == 0 else 1,
            "ran_ahead": ran_ahead * (continues_first if k == 0 else 1), "start_s": step_start,
            "duration_s": float(ends[k]) - step_start,
        })
    clock[0] = float(ends[-1])


@pytest.mark.parametrize("seed", range(12))
def test_quiet_runs_expand_into_the_rows_record_would_write(seed):
    rng = random.Random(seed)
    log, rows, clock = StepLog(replica=3, num_kv_blocks=128), [], [rng.uniform(0, 10)]
    # Patterns: runs first and last, back to back, between single recorded steps; or none at all (seed 0).
    kinds = [] if seed == 0 else [rng.choice("QQR") for _ in range(rng.randrange(1, 30))]
    if seed == 0:
        kinds = ["R"] * 5
    elif seed == 1:
        kinds = ["Q"]
    for kind in kinds:
        (_quiet if kind == "Q" else _recorded)(rng, log, rows, clock)
    table = log.to_arrow()
    assert table.column_names == _NAMES
    assert len(log) == table.num_rows == len(rows)
    expected = [{"replica": 3, "step": i, **row, "kv_usage": row["num_kv_blocks_used"] / 128.0}
                for i, row in enumerate(rows)]
    assert table.to_pylist() == [{name: row[name] for name in _NAMES} for row in expected]
    assert all(str(table.schema.field(c.name).type) == {"int64": "int64", "float64": "double"}[c.dtype]
               for c in STEP_COLUMNS)


class _Run:
    """Token times as a run of a shared buffer, as sim.simulator.StepEnds keeps them."""

    def __init__(self, ends_s: array, first: int, count: int) -> None:
        self.ends_s, self.first, self.count = ends_s, first, count

    def __len__(self) -> int:
        return self.count

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.frombuffer(self.ends_s, dtype=np.float64)[self.first:self.first + self.count]


def test_token_times_kept_as_runs_of_shared_buffers_read_as_arrays():
    ends_a, ends_b = array("d", np.arange(50) * 0.5), array("d", np.arange(30) * 0.25 + 100)
    kept = [_Run(ends_a, 3, 10), array("d", [1.0, 2.0]), _Run(ends_b, 0, 30), [], _Run(ends_a, 40, 10),
            array("d")]

    def rows(times):
        return [(f"r{i}", 0, 0.0, 0.0, 0.0, 1.0, 1, len(t), 0, 0, "stop", None, t) for i, t in enumerate(times)]

    as_arrays = [np.asarray(t, dtype=np.float64) for t in kept]
    table = requests_to_arrow(rows(kept))
    assert table.equals(requests_to_arrow(rows(as_arrays)))
    assert table.column("token_times_s").to_pylist() == [a.tolist() for a in as_arrays]
