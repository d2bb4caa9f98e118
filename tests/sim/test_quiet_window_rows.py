"""A quiet window's step-log rows, as QuietRun.finish writes them from its segments and the waiting queue's stretches,
checked row by row against what the step loop records for each of its steps."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.quiet_window import QuietRun, QuietWindow
from engine.core.records import StepLog

_STEP_S = 0.5


def _window_run(steps: int, finishes: list[int], num_staying: int, num_waiting: int, joins: list[tuple[int, int]],
                on_ends: bool, continues_first: int) -> tuple[SimpleNamespace, list[int], list[int]]:
    """A finished-to-be window of ``steps`` steps (no block event) whose rows finish in the steps of ``finishes`` (each
    its left) or stay past it (``num_staying``), with ``num_waiting`` requests waiting and ``joins`` (step, growth)
    joining: the run, each row's left and each step's waiting count as the step loop counts it."""
    lefts = sorted(finishes) + [steps + 1] * num_staying
    bounds = [0, *sorted({left for left in lefts if left < steps}), steps]
    contexts = [100 + 7 * i for i in range(len(lefts))]
    batches = []
    for first in bounds[:-1]:
        alive = [c for c, left in zip(contexts, lefts) if left > first]
        batches.append((len(alive), sum(alive) + len(alive) * first, max(alive) + first))
    ends = array("d", (_STEP_S * (k + 1) for k in range(steps)))
    starts = array("d", (0.0, *ends[:-1]))
    times, counts, count = [], [], num_waiting
    for at, grows in sorted(joins):  # a join at a step's very end, or within the step
        times.append(ends[min(at, steps - 1)] if on_ends else at * _STEP_S - _STEP_S / 2)
        count += grows
        counts.append(count)
    order = sorted(range(len(times)), key=times.__getitem__)
    waited_s, waited = [times[i] for i in order], [counts[i] for i in order]
    # The count after step k: those waiting at the start and those that joined by its end.
    all_counts = [num_waiting, *waited]
    per_step = [all_counts[n] for n in np.searchsorted(np.asarray(waited_s, dtype=np.float64), np.asarray(ends),
                                                          side="right").tolist()]
    window = QuietWindow(steps, ends[-1], True, bounds, batches, lefts, continues_first, False, None)
    rows = [SimpleNamespace(num_computed_tokens=c) for c in contexts]
    engine = SimpleNamespace(scheduler=SimpleNamespace(ran_decode_batch=lambda batch, num_steps: None,
                                                       config=SimpleNamespace(max_num_seqs=256)),
                             step_log=StepLog(), runner=SimpleNamespace(runs_decode_ahead=False))
    run = SimpleNamespace(window=window, engine=engine, starts=starts, ends=ends, _rows=rows, _running=rows,
                          _lasts=[min(left, steps) for left in lefts], _starting=[None] * len(rows), _slow=[],
                          _used_changes=[(0, 3)], _num_waiting=num_waiting, _waited_s=waited_s, _waited=waited,
                          _token_id=-1, advance=lambda t_s: [])
    run._waiting_changes = lambda num_steps: QuietRun._waiting_changes(run, num_steps)
    return run, lefts, per_step


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(1, 29), max_size=6), st.integers(1, 3), st.integers(0, 4),
       st.lists(st.tuples(st.integers(0, 32), st.integers(0, 2)), max_size=8), st.booleans(), st.integers(0, 1))
def test_a_windows_rows_are_the_step_loops_rows(steps, finishes, num_staying, num_waiting, joins, on_ends,
                                                continues_first):
    """Every row a window writes has its step's batch (rows, contexts, the finishes in it, whether it continues the
    batch before) and the requests waiting after it, wherever the waiting count changes: inside a segment, at its
    first or last step, several times in one, or not at all."""
    finishes = [left for left in finishes if left <= steps]
    run, lefts, per_step = _window_run(steps, finishes, num_staying, num_waiting, joins, on_ends, continues_first)
    assert QuietRun.finish(run) == []
    values = run.engine.step_log._column_values()
    assert values["num_waiting"].tolist() == per_step
    bounds = run.window.bounds
    expected_seqs, expected_finished, expected_continues, expected_contexts = [], [], [], []
    for j, (first, end) in enumerate(zip(bounds, bounds[1:])):
        bs, contexts, longest = run.window.batches[j]
        for k in range(first, end):
            expected_seqs.append(bs)
            expected_contexts.append(contexts + bs * (k - first))
            expected_finished.append(lefts.count(end) if k == end - 1 else 0)
            expected_continues.append(1 if k > first else 0 if j else continues_first)
    assert values["num_seqs"].tolist() == expected_seqs
    assert values["decode_context_tokens"].tolist() == expected_contexts
    assert values["num_finished"].tolist() == expected_finished
    assert values["continues_batch"].tolist() == expected_continues
    assert values["num_kv_blocks_used"].tolist() == [3] * steps
    assert values["start_s"].tolist() == list(run.starts)
