"""Session 35 (D): a replay's outputs written with less work, the same bytes.

- ``analysis.metrics.itl_values``: the lists' times and lengths read from their offsets, without
  ``pyarrow.compute`` (imported for nothing else in a replay).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis.metrics import _itl_values_per_list, itl_values, summarize

REPO = Path(__file__).resolve().parents[2]


def _frame(lists) -> pl.DataFrame:
    return pl.DataFrame({"token_times_s": pl.Series(lists, dtype=pl.List(pl.Float64))})


@pytest.mark.parametrize("lists, expected", [
    ([[1.0, 2.0, 4.0], [], [5.0], [6.0, 6.5]], [1.0, 2.0, 0.5]),
    ([[1.0, 2.0], None, [3.0, 5.0]], [1.0, 2.0]),  # a null list: by value_lengths, as before
    ([[1.0, None, 3.0, 4.0]], [1.0]),  # a null time: list by list
    ([[], [], []], []),
    ([[1.0], [2.0]], []),
    ([], []),
])
def test_itl_values_gaps_within_lists_only(lists, expected):
    frame = _frame(lists)
    assert itl_values(frame).tolist() == expected
    if lists:
        assert itl_values(frame).tolist() == _itl_values_per_list(frame["token_times_s"]).tolist()


def test_itl_values_of_a_slice_and_of_chunks():
    frame = _frame([[1.0, 2.0], [3.0, 4.5, 7.0], [8.0, 9.0], [10.0, 10.25]])
    assert itl_values(frame.slice(1, 2)).tolist() == [1.5, 2.5, 1.0]
    chunked = pl.concat([frame.slice(0, 2), frame.slice(2, 2)], rechunk=False)
    assert chunked["token_times_s"].n_chunks() == 2
    assert itl_values(chunked).tolist() == [1.0, 1.5, 2.5, 1.0, 0.25]


def test_itl_values_imports_no_pyarrow_compute():
    code = (
        "import sys, polars as pl\n"
        "from analysis.metrics import itl_values\n"
        "frame = pl.DataFrame({'token_times_s': pl.Series([[1.0, 2.0], [3.0, 4.5]], dtype=pl.List(pl.Float64))})\n"
        "assert itl_values(frame).tolist() == [1.0, 1.5]\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_summary_from_sorted_gaps_is_the_same():
    rng = np.random.default_rng(3)
    times = [np.cumsum(rng.lognormal(-3.5, 0.5, int(n))) + i for i, n in enumerate(rng.integers(2, 400, 60))]
    requests = pl.DataFrame({
        "request_id": [str(i) for i in range(len(times))],
        "arrival_s": [float(t[0]) - 0.1 for t in times],
        "first_scheduled_s": [float(t[0]) - 0.05 for t in times],
        "first_token_s": [float(t[0]) for t in times],
        "finish_s": [float(t[-1]) for t in times],
        "prompt_tokens": [10] * len(times),
        "output_tokens": [len(t) for t in times],
        "cached_tokens": [0] * len(times),
        "num_preemptions": [0] * len(times),
        "finish_reason": ["length"] * len(times),
        "reject_reason": pl.Series([None] * len(times), dtype=pl.String),
        "token_times_s": pl.Series([t.tolist() for t in times], dtype=pl.List(pl.Float64)),
    })
    itl_s = itl_values(requests)
    plain = summarize(requests, None, itl_s=itl_s)
    ordered = summarize(requests, None, itl_s=itl_s, sorted_itl_s=np.sort(itl_s))
    assert ordered == plain
    assert ordered["itl_ms"]["p99"] is not None
