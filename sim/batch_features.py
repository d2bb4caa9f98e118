"""What a step's cost depends on, read off a ScheduledBatch or a recorded step log (shared by the
profiler, the cost models and their calibration)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import attrgetter
from pathlib import Path

import numpy as np
import polars as pl

from engine.core.records import BATCH_COLUMNS
from engine.core.scheduler import ScheduledBatch
from sim.files import read_parquet_table
from traces.validation import MAX_RUN_TIME_S

FEATURE_NAMES = BATCH_COLUMNS  # every batch column of the step log, read off the batch by name
# A recorded step's counts and a profile's grid features (sim.profiled_cost_model) are integers below this, and a
# run's times lie within a trace's span of its start: a count of 2**62 or a start at 1e300 s was read as it was, and
# calibrated the profile to a clamped factor (0.25, 2.0) without a word.
MAX_COUNT = 2**53
MAX_TIME_S = MAX_RUN_TIME_S
# The columns that order the steps and tell where the engine went straight on (periods, continues_batch): a text
# 'step' sorted "10" before "2" and calibrated on wrong periods (host factor 4.0, the clamp), nulls passed unseen.
STEP_KEY = ("replica", "step")  # what names a step of a run
STEP_ORDER_COLUMNS = ("replica", "step", "num_running", "num_waiting", "num_preempted", "num_finished")


def is_count(value: object) -> bool:
    """An int (not a bool) from 0 to below MAX_COUNT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


_READ_FEATURES = attrgetter(*FEATURE_NAMES)  # (one C call for the tuple: the cost model reads a batch every step)


def batch_features(batch: ScheduledBatch) -> dict[str, int]:
    return dict(zip(FEATURE_NAMES, _READ_FEATURES(batch)))


def derive_continues_batch(replica, num_seqs, num_prefill_seqs, num_preempted, num_finished) -> np.ndarray:
    """``continues_batch`` of each step of a step log recorded before the column existed (rows in step order per
    replica; numpy arrays): a decode-only step continues the one before it when that was decode-only on the same
    replica, finished nobody, and this one preempted nobody and has as many sequences (a step cannot gain one
    without a prefill row, bar a request admitted with all but one prompt token cached, which adds a row). Exact
    except where, between the same two steps, a request was aborted and another admitted that way."""
    decode_only = (num_prefill_seqs == 0) & (num_seqs > 0)
    continues = np.zeros(len(num_seqs), dtype=np.int64)
    if len(num_seqs) > 1:
        continues[1:] = (decode_only[1:] & decode_only[:-1] & (replica[1:] == replica[:-1]) & (num_finished[:-1] == 0)
                         & (num_preempted[1:] == 0) & (num_seqs[1:] == num_seqs[:-1]))
    return continues


def read_steps(run_dir: Path, periods: bool = False) -> list[tuple[dict, float, float]]:
    """(features, duration_s, start_s) for every step of a replay's ``steps.parquet``. With ``periods``, each
    step's *period* replaces its duration where the engine went straight on to another step (requests were
    left): the time from its start to the next step's start on that replica. Between the two, a GPU replay's loop
    takes in the requests that arrived and records the finished ones (and, in runs recorded before a step's
    duration included it, postprocessed the step): 0.03-0.3 ms a step on the H200's host, which the simulator
    (its steps back to back) must count in the step."""
    import pyarrow as pa

    path = Path(run_dir) / "steps.parquet"
    if not path.is_file():  # a folder of that name was "no steps.parquet" too, which sent the user looking for none
        what = "is not a regular file" if path.exists() else "no steps.parquet"
        raise FileNotFoundError(f"{path}: {what} (expected an engine.replay output folder)")
    try:
        table = read_parquet_table(path)
    except (OSError, pa.ArrowException) as exc:
        # Only the first line: arrow's message for a repeated column goes on with the whole schema, a line a column.
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a readable parquet file ({reason}); expected an engine.replay steps.parquet") \
            from None
    needed = FEATURE_NAMES + ("duration_s", "start_s")
    derived_from = ("replica", "step", "num_seqs", "num_prefill_seqs", "num_preempted", "num_finished")
    _check_step_order_columns(table, path)
    if "continues_batch" not in table.column_names and all(c in table.column_names for c in derived_from):
        table = table.sort_by([("replica", "ascending"), ("step", "ascending")])
        arrays = {c: table.column(c).to_numpy() for c in ("replica", "num_seqs", "num_prefill_seqs", "num_preempted",
                                                           "num_finished")}
        table = table.append_column("continues_batch", pa.array(derive_continues_batch(**arrays)))
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing)} (recorded by an older engine?)")
    columns = {c: table.column(c).to_pylist() for c in needed}
    for name, values in columns.items():  # a null, NaN or negative value would become a wrong fit, not an error
        for row, value in enumerate(values):
            if name in FEATURE_NAMES:
                ok = is_count(value)
                expected = "an integer from 0 to 2**53"
            else:  # an absurd duration is named by the command, with what it expects of one (sim.calibrate's > 0)
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
                      and (name != "start_s" or value <= MAX_TIME_S))
                expected = (f"a finite number of seconds from 0 to {MAX_TIME_S:g}" if name == "start_s"
                            else "a finite number of seconds >= 0")
            if not ok:
                raise ValueError(f"{path}: row {row}: column {name!r} is {value!r}; expected {expected}")
    times = columns["duration_s"]
    if periods:
        times = _periods(table, times, columns["start_s"], path)
    return [
        ({c: columns[c][i] for c in FEATURE_NAMES}, times[i], columns["start_s"][i])
        for i in range(table.num_rows)
    ]


def repeated_keys(frame: pl.DataFrame, key: Iterable[str]) -> pl.Series | None:
    """Which rows hold a ``key`` another row also holds (a boolean Series), or None when no key repeats.

    Runs write their step logs in key order (replica, then step): integer keys that strictly increase row by row
    repeat nothing, which one pass over the columns shows; hashing every row's key for ``is_duplicated`` took 0.2 s
    a table of the Azure trace's 1.78M steps, and analysis.compare asked four times. Other tables (string ids, rows
    out of order, nulls) are hashed."""
    key = list(key)
    if frame.height < 2:
        return None
    columns = [frame[name] for name in key]
    if all(column.dtype.is_integer() and not column.null_count() for column in columns):
        later = np.zeros(frame.height - 1, dtype=bool)  # row i + 1's key is above row i's, in the columns so far
        tied = np.ones(frame.height - 1, dtype=bool)  # ... or equal to it
        for column in columns:
            values = column.to_numpy()
            later |= tied & (values[1:] > values[:-1])
            tied &= values[1:] == values[:-1]
        if later.all():
            return None
    repeated = frame.select(pl.struct(*key).is_duplicated() if len(key) > 1 else pl.col(key[0]).is_duplicated())
    repeated = repeated.to_series()
    return repeated if repeated.any() else None


def repeated_step(frame: pl.DataFrame) -> tuple[int, int, int, int] | None:
    """(row, replica, step, earlier row) of the first row of a step log (replica and step columns, integers without
    nulls) that repeats a step its replica logged before, or None: one check for every reader of step logs
    (sim.calibrate and sim.host_speed through read_steps, analysis.schema.check_steps)."""
    if repeated_keys(frame, STEP_KEY) is None:
        return None
    later = int((~frame.select(pl.struct(*STEP_KEY).is_first_distinct()).to_series()).arg_true()[0])
    replica, step = int(frame["replica"][later]), int(frame["step"][later])
    earlier = int(((frame["replica"] == replica) & (frame["step"] == step)).arg_true()[0])
    return later, replica, step, earlier


def _check_step_order_columns(table, path: Path) -> None:
    """ValueError naming the first of STEP_ORDER_COLUMNS present in ``table`` that is not integers from 0 to 2**53,
    with the row of its first bad value (checked on the whole column at once: a run has up to millions of steps), or
    the first row that repeats a step of its replica."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in STEP_ORDER_COLUMNS:
        if name not in table.column_names:
            continue  # a missing one is named where it is needed
        column = table.column(name)
        if not pa.types.is_integer(column.type):
            raise ValueError(f"{path}: column {name!r} has type {column.type}; expected integers from 0 to 2**53")
        bad = pc.or_kleene(pc.less(column, 0), pc.greater_equal(column, MAX_COUNT)).fill_null(True)
        rows = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
        if len(rows):
            row = int(rows[0])
            raise ValueError(f"{path}: row {row}: column {name!r} is {column[row].as_py()!r}; expected an integer "
                             "from 0 to 2**53")
    if "replica" in table.column_names and "step" in table.column_names:
        # A step given twice was counted twice: sim.calibrate fitted its factors with that step's time weighted double
        # (analysis.summarize and analysis.compare refuse such a log).
        found = repeated_step(pl.from_arrow(table.select(list(STEP_KEY))))
        if found is not None:
            row, replica, step, earlier = found
            raise ValueError(f"{path}: row {row}: column 'step' is {step}; expected one row per step of a replica "
                             f"(replica {replica}, step {step} is also at row {earlier})")


def went_straight_on(replica: np.ndarray, num_running: np.ndarray, num_waiting: np.ndarray) -> np.ndarray:
    """For steps in (replica, step) order: whether the engine went straight on from each step to the next one (the
    same replica, with requests left after the first), one entry per consecutive pair."""
    return (replica[1:] == replica[:-1]) & (num_running[:-1] + num_waiting[:-1] > 0)


def _periods(table, durations_s: list[float], starts_s: list[float], path: Path) -> list[float]:
    names = ("replica", "step", "num_running", "num_waiting")
    missing = [c for c in names if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing)}; expected an engine.replay steps.parquet")
    replica, step, running, waiting = (table.column(c).to_numpy() for c in names)
    order = np.lexsort((step, replica))
    on = went_straight_on(replica[order], running[order], waiting[order])
    i, j = order[:-1][on], order[1:][on]
    periods = np.asarray(durations_s, dtype=np.float64)
    starts = np.asarray(starts_s, dtype=np.float64)
    periods[i] = np.maximum(periods[i], starts[j] - starts[i])
    return periods.tolist()
