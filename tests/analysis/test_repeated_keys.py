"""sim.batch_features.repeated_keys: the rows whose key repeats, found in one pass when the keys are written in order
and by hashing otherwise; both ways must give the same answer as polars' is_duplicated."""

from __future__ import annotations

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.schema import check_steps
from sim.batch_features import repeated_keys


def _expected(frame: pl.DataFrame, key: list[str]) -> list[bool] | None:
    mask = frame.select(key).is_duplicated()
    return mask.to_list() if mask.any() else None


@pytest.mark.parametrize(("replicas", "steps", "expected"), [
    ([0, 0, 0, 1, 1], [0, 1, 2, 0, 1], None),  # in order: nothing repeats
    ([0, 0, 1, 1], [0, 0, 0, 1], [True, True, False, False]),  # a step twice, in order
    ([0, 1, 0], [0, 0, 0], [True, False, True]),  # out of order: hashed
    ([1, 0], [5, 7], None),  # out of order, distinct
    ([0], [3], None),
    ([], [], None),
])
def test_exact_rows(replicas: list[int], steps: list[int], expected: list[bool] | None) -> None:
    frame = pl.DataFrame({"replica": replicas, "step": steps}, schema={"replica": pl.Int64, "step": pl.Int64})
    mask = repeated_keys(frame, ("replica", "step"))
    assert (None if mask is None else mask.to_list()) == expected


def test_strings_and_nulls_are_hashed() -> None:
    ids = pl.DataFrame({"request_id": ["a", "b", "a"]})
    assert repeated_keys(ids, ["request_id"]).to_list() == [True, False, True]
    with_null = pl.DataFrame({"replica": [0, None, None], "step": [0, 1, 1]})
    assert repeated_keys(with_null, ["replica", "step"]).to_list() == [False, True, True]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6)), max_size=40), st.booleans())
def test_same_answer_as_is_duplicated(rows: list[tuple[int, int]], in_order: bool) -> None:
    if in_order:
        rows = sorted(rows)
    frame = pl.DataFrame({"replica": [r for r, _ in rows], "step": [s for _, s in rows]},
                         schema={"replica": pl.Int64, "step": pl.Int64})
    mask = repeated_keys(frame, ["replica", "step"])
    assert (None if mask is None else mask.to_list()) == _expected(frame, ["replica", "step"])


def test_check_steps_names_the_later_row_of_a_step_given_twice() -> None:
    frame = pl.DataFrame({"replica": [0, 0, 0], "step": [0, 1, 1]})
    with pytest.raises(ValueError, match=r"column 'step' is 1 at row 2; expected one row per step of a replica "
                                         r"\(replica 0, step 1 is also at row 1\)"):
        check_steps(frame)
