"""Session 33 (helper B): a quiet window's blocks in use reach the step log as stretches of one count, given with
the window's first run for all its runs (the runs after it pass None); the log expands them into one count a step,
as record() would have written them."""

from __future__ import annotations

import random
from array import array
from types import SimpleNamespace

import pytest

from engine.core.records import BATCH_COLUMNS, StepLog


@pytest.mark.parametrize("seed", range(20))
def test_stretches_given_with_a_windows_first_run_expand_to_a_count_a_step(seed):
    rng = random.Random(seed)
    log = StepLog(num_kv_blocks=64)
    expected: list[int] = []
    clock = 1.0
    for _ in range(rng.randrange(1, 8)):
        if rng.random() < 0.3:  # a recorded step between windows
            count = rng.randrange(64)
            batch = SimpleNamespace(**{name: 1 for name in BATCH_COLUMNS}, preempted=[])
            log.record(batch, clock, 0.01, 1, 0, count, 0)
            expected.append(count)
            clock += 0.01
            continue
        # A window: runs back to back (segments, arrivals), the counts changing anywhere in it.
        lengths = [rng.choice([1, 2, rng.randrange(3, 30)]) for _ in range(rng.randrange(1, 4))]
        steps = sum(lengths)
        firsts = sorted({0, *rng.sample(range(steps), min(steps, rng.randrange(0, 4)))})
        stretches = [(first, rng.randrange(64)) for first in firsts]
        per_step = []
        for index, (first, count) in enumerate(stretches):
            end = stretches[index + 1][0] if index + 1 < len(stretches) else steps
            per_step.extend([count] * (end - first))
        done = 0
        for length in lengths:
            ends = array("d", (clock + 0.01 * (k + 1) for k in range(length)))
            log.extend_quiet(2, 100, 60, None if done else stretches, clock, ends)
            clock = ends[-1]
            done += length
        expected.extend(per_step)
    column = log.to_arrow().column("num_kv_blocks_used").to_pylist()
    assert column == expected
