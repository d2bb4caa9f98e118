"""The schedule diff of two tables whose keys line up (row i against row i, no join) must say exactly what the join
says: the same counts per column, the same rows differing and the same first difference with both rows."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.compare.step_diff import _diff_tables

_COLUMNS = ("num_seqs", "num_prefill_tokens")


def _table(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    replicas, steps, seqs, tokens = (list(values) for values in zip(*rows)) if rows else ([], [], [], [])
    return pl.DataFrame({"replica": replicas, "step": steps, "num_seqs": seqs, "num_prefill_tokens": tokens},
                        schema={name: pl.Int64 for name in ("replica", "step", *_COLUMNS)})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), unique=True, max_size=12),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3), st.integers(0, 3)), max_size=6))
def test_aligned_tables_give_what_the_join_gives(keys: list[tuple[int, int]],
                                                 edits: list[tuple[int, int, int]]) -> None:
    keys = sorted(keys)
    real_rows = [(replica, step, 1 + step, 8 * replica) for replica, step in keys]
    sim_rows = [list(row) for row in real_rows]
    for row, column, value in edits:  # a few values changed on the simulated side
        if row < len(sim_rows):
            sim_rows[row][2 + column % 2] = value
    real, sim = _table(real_rows), _table([tuple(row) for row in sim_rows])
    aligned = _diff_tables(real, sim, ("replica", "step"), _COLUMNS, order_by="step")
    joined = _diff_tables(real, sim.reverse(), ("replica", "step"), _COLUMNS, order_by="step")  # keys out of line
    assert aligned == joined


def test_a_changed_value_is_found_with_both_rows() -> None:
    real = _table([(0, 0, 1, 100), (0, 1, 2, 0), (1, 0, 1, 50)])
    sim = _table([(0, 0, 1, 100), (0, 1, 3, 0), (1, 0, 1, 60)])
    diff = _diff_tables(real, sim, ("replica", "step"), _COLUMNS, order_by="step")
    assert (diff.num_compared, diff.num_differing, diff.differing_columns) == (3, 2, {"num_seqs": 1,
                                                                                      "num_prefill_tokens": 1})
    first = diff.first_difference  # the smallest step, then replica: replica 1's step 0 before replica 0's step 1
    assert first.key == {"replica": 1, "step": 0} and first.columns == ("num_prefill_tokens",)
    assert first.real_row == {"num_seqs": 1, "num_prefill_tokens": 50}
    assert first.sim_row == {"num_seqs": 1, "num_prefill_tokens": 60}
