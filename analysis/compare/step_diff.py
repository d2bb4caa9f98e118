"""Step-by-step comparison of what two replays scheduled (not how long it took).

For offline runs the simulator must reproduce the real schedule exactly: the
same batches step by step, the same preemptions and prefix-cache hits. Timings
are left out on purpose (they are the cost model's business); the columns
compared are the ones that say WHICH work each step did. The first differing
step is reported with both rows, since everything after it usually differs too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import polars as pl

from analysis.schema import STEPS_SCHEMA, conform, conform_requests
from engine.core.messages import counted
from engine.core.records import OPTIONAL_SCHEDULE_COLUMNS, OPTIONAL_STEP_COLUMNS, SCHEDULE_COLUMNS
from sim.batch_features import STEP_KEY, repeated_keys

# finish_reason too: a request cut by another limit (max_model_len vs kv_capacity) at the same length, or one that
# stopped where the other was cut, was scheduled differently, and the diff said "identical".
REQUEST_SCHEDULE_COLUMNS: tuple[str, ...] = (
    "replica", "prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions", "finish_reason",
)
_STEPS_SCHEMA = {**STEPS_SCHEMA, **{column: pl.Int64() for column in OPTIONAL_STEP_COLUMNS}}
SIM_SUFFIX = "_sim"
_IN_REAL, _IN_SIM, _ORDER = "__in_real", "__in_sim", "__order"


@dataclass(frozen=True)
class RowDifference:
    """The first differing step (key: replica, step) or request (key: request_id), with both rows.

    `missing_in` is "real" or "sim" when the row exists on one side only (then
    that side's row is None and `columns` is empty).
    """

    key: dict[str, object]
    columns: tuple[str, ...]
    real_row: dict[str, object] | None
    sim_row: dict[str, object] | None
    missing_in: str | None = None


@dataclass(frozen=True)
class TableDiff:
    """Row-by-row equality of one table's schedule columns between two runs."""

    num_real: int
    num_sim: int
    num_compared: int
    num_differing: int
    differing_columns: dict[str, int] = field(default_factory=dict)
    first_difference: RowDifference | None = None
    columns: tuple[str, ...] = ()  # the columns compared

    @property
    def identical(self) -> bool:
        return self.num_differing == 0


@dataclass(frozen=True)
class ScheduleDiff:
    """Steps compared per (replica, step); requests (optional) per request_id. `unavailable` says why
    there is nothing to compare (a run without a step log: served over HTTP or imported); then both
    tables are None and the schedules are neither identical nor different."""

    steps: TableDiff | None
    requests: TableDiff | None = None
    unavailable: str | None = None

    @property
    def identical(self) -> bool:
        if self.steps is None:
            return False
        return self.steps.identical and (self.requests is None or self.requests.identical)

    def to_dict(self) -> dict:
        if self.steps is None:
            return {"identical": None, "unavailable": self.unavailable, "steps": None, "requests": None}
        return {"identical": self.identical, "steps": asdict(self.steps),
                "requests": None if self.requests is None else asdict(self.requests)}

    def describe(self) -> str:
        """Multi-line text: "schedules identical: N steps ..." or "schedules differ" and the first difference."""
        if self.steps is None:
            return f"schedule diff: n/a ({self.unavailable})"
        if self.identical:
            text = f"schedules identical: {counted(self.steps.num_compared, 'step')}"
            if self.requests is not None:
                text += (f", {counted(self.requests.num_compared, 'request')} (same placement, tokens, cached tokens, "
                         "preemptions)")
            return text
        lines = ["schedules differ"]
        if self.steps.identical:
            lines.append(f"steps identical: {counted(self.steps.num_compared, 'step')}")
        lines += _describe_table(self.steps, "steps", self.steps.columns)
        if self.requests is not None:
            if self.requests.identical:
                lines.append(f"requests identical: {counted(self.requests.num_compared, 'request')}")
            lines += _describe_table(self.requests, "requests", self.requests.columns)
        return "\n".join(lines)


def _diff_tables(real: pl.DataFrame, sim: pl.DataFrame, key: tuple[str, ...], columns: tuple[str, ...],
                 order_by: str) -> TableDiff:
    """Full outer join on `key`; a row differs if any of `columns` differs or it exists on one side only.

    "First" means smallest `order_by` (taken from whichever side has the row),
    ties broken by `key`: the earliest step over all replicas, or the earliest
    arrival rather than the smallest id string.
    """
    for frame, side in ((real, "real"), (sim, "sim")):
        repeated = repeated_keys(frame, key)
        if repeated is not None:
            example = frame.filter(repeated).row(0, named=True)
            raise ValueError(f"{side} table repeats key {', '.join(f'{k}={example[k]}' for k in key)}")
    if _aligned(real, sim, key):
        return _diff_aligned(real, sim, key, columns, order_by)
    left = real.select(*key, *columns, pl.col(order_by).alias(_ORDER)).with_columns(pl.lit(True).alias(_IN_REAL))
    right = sim.select(*key, *columns, pl.col(order_by).alias(_ORDER)).with_columns(pl.lit(True).alias(_IN_SIM))
    joined = left.join(right, on=list(key), how="full", coalesce=True, suffix=SIM_SUFFIX)
    in_both = pl.col(_IN_REAL).is_not_null() & pl.col(_IN_SIM).is_not_null()
    order = pl.coalesce(pl.col(_ORDER), pl.col(_ORDER + SIM_SUFFIX)).alias(_ORDER)
    flags = [pl.col(column).ne_missing(pl.col(column + SIM_SUFFIX)).alias(column) for column in columns]
    flagged = joined.select(*key, order, in_both.alias("__in_both"), *flags)
    differs = (~pl.col("__in_both")) | pl.any_horizontal(*(pl.col(column) for column in columns))
    flagged = flagged.with_columns(differs.alias("__differs")).sort(_ORDER, *key, nulls_last=True)
    compared = flagged.filter(pl.col("__in_both"))
    counts = compared.select(pl.col(column).sum() for column in columns).row(0, named=True) if compared.height else {}
    differing_columns = {column: int(count) for column, count in counts.items() if count}
    differing = flagged.filter(pl.col("__differs"))
    first = None
    if differing.height:
        first = _first_difference(differing.row(0, named=True), joined, key, columns)
    return TableDiff(num_real=real.height, num_sim=sim.height, num_compared=compared.height,
                     num_differing=differing.height, differing_columns=differing_columns, first_difference=first,
                     columns=tuple(columns))


def _aligned(real: pl.DataFrame, sim: pl.DataFrame, key: tuple[str, ...]) -> bool:
    """Whether both tables hold the same keys, none null, in the same order: one trace replayed twice, or a run and
    its simulation that took the same steps. Row i of one then is row i of the other."""
    return real.height == sim.height and all(
        real[name].null_count() == 0 and real[name].equals(sim[name]) for name in key)


def _diff_aligned(real: pl.DataFrame, sim: pl.DataFrame, key: tuple[str, ...], columns: tuple[str, ...],
                  order_by: str) -> TableDiff:
    """``_diff_tables`` of two ``_aligned`` tables, row against row: the same counts and first difference without the
    join, which copied both tables' compared columns into one (1.78M steps of the Azure trace: ~0.5 GB and 0.3 CPU s
    more)."""
    flags = pl.DataFrame([real[column].ne_missing(sim[column]).alias(column) for column in columns])
    counts = flags.sum().row(0, named=True) if real.height else {}
    differs = flags.select(pl.any_horizontal(pl.all())).to_series() if real.height else pl.Series([], dtype=pl.Boolean)
    num_differing = int(differs.sum())
    first = None
    if num_differing:
        # The smallest order_by, ties by key: the row the joined path's sort puts first.
        candidates = real.select(*key, pl.col(order_by).alias(_ORDER)).with_row_index("__row").filter(differs)
        row = int(candidates.sort(_ORDER, *key, nulls_last=True)["__row"][0])
        first = RowDifference(key={name: real[name][row] for name in key},
                              columns=tuple(column for column in columns if flags[column][row]),
                              real_row={column: real[column][row] for column in columns},
                              sim_row={column: sim[column][row] for column in columns})
    return TableDiff(num_real=real.height, num_sim=sim.height, num_compared=real.height, num_differing=num_differing,
                     differing_columns={column: int(count) for column, count in counts.items() if count},
                     first_difference=first, columns=tuple(columns))


def _first_difference(
    flags: Mapping[str, object], joined: pl.DataFrame, key: tuple[str, ...], columns: tuple[str, ...]
) -> RowDifference:
    key_values = {name: flags[name] for name in key}
    match = joined.filter(pl.all_horizontal(*(pl.col(name) == value for name, value in key_values.items())))
    row = match.row(0, named=True)
    real_row = {column: row[column] for column in columns} if row[_IN_REAL] else None
    sim_row = {column: row[column + SIM_SUFFIX] for column in columns} if row[_IN_SIM] else None
    missing_in = "real" if real_row is None else "sim" if sim_row is None else None
    differing = () if missing_in else tuple(column for column in columns if flags[column])
    return RowDifference(key=key_values, columns=differing, real_row=real_row, sim_row=sim_row, missing_in=missing_in)


def compare_schedules(real_steps: pl.DataFrame, sim_steps: pl.DataFrame, real_requests: pl.DataFrame | None = None,
                      sim_requests: pl.DataFrame | None = None) -> ScheduleDiff:
    """Compare two runs' schedules step by step (per replica), and per request when both tables are given.

    Steps are matched on (replica, step) and compared on `SCHEDULE_COLUMNS` and the
    `OPTIONAL_SCHEDULE_COLUMNS` both runs logged (not ``ran_ahead``: how a runner ran a step, not what it ran);
    requests on `request_id` and compared on
    `REQUEST_SCHEDULE_COLUMNS` (placement, token counts, prefix-cache hits, preemptions and finish reason). A step or
    request present on one side only counts as a difference.
    """
    # The batch's composition too, where both runs logged it (runs recorded before these columns lack them): two
    # steps of equal token totals but other rows (which sequence got which chunk, the longest decode context) were
    # "identical" here, though the cost model prices them differently and tests/engine/test_replay.py had to compare
    # those columns itself.
    compared = (*SCHEDULE_COLUMNS, *(column for column in OPTIONAL_SCHEDULE_COLUMNS
                                     if column in real_steps.columns and column in sim_steps.columns))
    step_columns = (*STEP_KEY, *compared)
    steps = _diff_tables(conform(real_steps, _STEPS_SCHEMA, "steps", step_columns),
                         conform(sim_steps, _STEPS_SCHEMA, "steps", step_columns), STEP_KEY, compared, order_by="step")
    if real_requests is None or sim_requests is None:
        return ScheduleDiff(steps=steps)
    request_columns = ("request_id", "arrival_s", *REQUEST_SCHEDULE_COLUMNS)
    # Arrivals from each run's first one: a GPU run's clock need not start at 0 like the simulator's, and the first
    # difference is the earliest by arrival taken from either side (a request one run lacks has only the other's):
    # a GPU run at t = 1000 s beside a simulation of more requests named a sim-only request 20 s into the run first,
    # before one that differed 0.3 s into it.
    real, sim = (conform_requests(frame, request_columns).with_columns(
        pl.col("request_id").cast(pl.Utf8), pl.col("arrival_s") - pl.col("arrival_s").min())
        for frame in (real_requests, sim_requests))
    requests = _diff_tables(real, sim, ("request_id",), REQUEST_SCHEDULE_COLUMNS, order_by="arrival_s")
    return ScheduleDiff(steps=steps, requests=requests)


def _format_key(key: Mapping[str, object]) -> str:
    return ", ".join(f"{name} {value!r}" if isinstance(value, str) else f"{name} {value}"
                     for name, value in key.items())


def _row_lines(difference: RowDifference, columns: tuple[str, ...]) -> list[str]:
    """Both rows side by side, one column per line, differing columns marked with "*"."""
    width = max(len(column) for column in columns)
    lines = [f"    {'column':<{width}}  {'real':>12}  {'sim':>12}"]
    for column in columns:
        real = "-" if difference.real_row is None else str(difference.real_row[column])
        sim = "-" if difference.sim_row is None else str(difference.sim_row[column])
        mark = "  *" if column in difference.columns else ""
        lines.append(f"    {column:<{width}}  {real:>12}  {sim:>12}{mark}")
    return lines


def _describe_table(diff: TableDiff, noun: str, columns: tuple[str, ...]) -> list[str]:
    first = diff.first_difference
    if first is None:
        return []
    where = _format_key(first.key)
    if first.missing_in:
        head = f"  first: {where} exists only in {'sim' if first.missing_in == 'real' else 'real'}"
    else:
        head = f"  first: {where}, differing in {', '.join(first.columns)}"
    counts = ", ".join(f"{column} ({count})" for column, count in diff.differing_columns.items())
    # Out of every key on either side (keys are unique per side): the larger side alone undercounts when each side
    # has keys the other lacks (other replica counts: "9206 of 8842").
    num_keys = diff.num_real + diff.num_sim - diff.num_compared
    lines = [
        f"{noun} differ: {diff.num_differing} of {num_keys} (real {diff.num_real}, sim {diff.num_sim}, "
        f"{diff.num_compared} in both)",
        head,
    ]
    if counts:
        lines.append(f"  {noun} differing per column: {counts}")
    return lines + _row_lines(first, columns)
