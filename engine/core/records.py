"""Per-request and per-step records in one schema for GPU replays and simulations.

Kept in plain arrays on the hot path; turned into pyarrow tables (parquet) only at the end.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Iterable

from engine.core.sequence import Sequence

if TYPE_CHECKING:
    import pyarrow as pa

    from engine.core.scheduler import ScheduledBatch

# What a step scheduled: identical in a simulation and a GPU run of the same offline schedule.
SCHEDULE_COLUMNS = (
    "num_seqs",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "prefill_context_tokens",
    "num_decode_seqs",
    "decode_context_tokens",
    "num_batched_tokens",
    "num_running",
    "num_waiting",
    "num_kv_blocks_used",
    "num_preempted",
    "num_finished",
)
COST_COLUMNS = ("prefill_attention_pairs", "max_decode_context_tokens")  # derived from the batch, for cost models
STEP_INT_COLUMNS = ("replica", "step", *SCHEDULE_COLUMNS, *COST_COLUMNS)
STEP_FLOAT_COLUMNS = ("start_s", "duration_s", "kv_usage")


class StepLog:
    """One row per engine step, columnar so a million-step simulation stays small and fast."""

    def __init__(self, replica: int = 0, num_kv_blocks: int = 1) -> None:
        self.replica = replica
        self.num_kv_blocks = num_kv_blocks
        self._ints = {name: array("q") for name in STEP_INT_COLUMNS}
        self._floats = {name: array("d") for name in STEP_FLOAT_COLUMNS}
        c = self._ints
        f = self._floats
        self._appenders = (
            c["num_seqs"].append,
            c["num_prefill_seqs"].append,
            c["num_prefill_tokens"].append,
            c["prefill_context_tokens"].append,
            c["num_decode_seqs"].append,
            c["decode_context_tokens"].append,
            c["prefill_attention_pairs"].append,
            c["max_decode_context_tokens"].append,
            c["num_batched_tokens"].append,
            c["num_running"].append,
            c["num_waiting"].append,
            c["num_kv_blocks_used"].append,
            c["num_preempted"].append,
            c["num_finished"].append,
            f["start_s"].append,
            f["duration_s"].append,
        )

    def __len__(self) -> int:
        return len(self._floats["start_s"])

    def record(
        self,
        batch: ScheduledBatch,
        start_s: float,
        duration_s: float,
        num_running: int,
        num_waiting: int,
        num_kv_blocks_used: int,
        num_finished: int,
    ) -> None:
        values = (
            len(batch.seqs),
            batch.num_prefill_seqs,
            batch.num_prefill_tokens,
            batch.prefill_context_tokens,
            batch.num_decode_seqs,
            batch.decode_context_tokens,
            batch.prefill_attention_pairs,
            batch.max_decode_context_tokens,
            batch.num_prefill_tokens + batch.num_decode_seqs,
            num_running,
            num_waiting,
            num_kv_blocks_used,
            len(batch.preempted),
            num_finished,
            start_s,
            duration_s,
        )
        for append, value in zip(self._appenders, values):
            append(value)

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        n = len(self)
        columns: dict[str, object] = {}
        columns["replica"] = pa.array([self.replica] * n, pa.int64())
        columns["step"] = pa.array(range(n), pa.int64())
        for name in STEP_INT_COLUMNS[2:]:
            columns[name] = pa.array(self._ints[name], pa.int64())
        columns["start_s"] = pa.array(self._floats["start_s"], pa.float64())
        columns["duration_s"] = pa.array(self._floats["duration_s"], pa.float64())
        used = pa.array(self._ints["num_kv_blocks_used"], pa.float64())
        import pyarrow.compute as pc

        columns["kv_usage"] = pc.divide(used, float(self.num_kv_blocks))
        return pa.table(columns)


REQUEST_SCHEMA_FIELDS = (
    ("request_id", "string"),
    ("replica", "int64"),
    ("arrival_s", "float64"),
    ("first_scheduled_s", "float64"),
    ("first_token_s", "float64"),
    ("finish_s", "float64"),
    ("prompt_tokens", "int64"),
    ("output_tokens", "int64"),
    ("cached_tokens", "int64"),
    ("num_preemptions", "int64"),
    ("finish_reason", "string"),
    ("reject_reason", "string"),
)


def request_row(seq: Sequence) -> tuple:
    """A finished sequence's record: the fields of REQUEST_SCHEMA_FIELDS, then its token times."""
    return (
        str(seq.request_id),
        seq.replica,
        seq.arrival_s,
        seq.first_scheduled_s,
        seq.first_token_s,
        seq.finish_s,
        seq.num_prompt_tokens,
        seq.num_completion_tokens,
        seq.num_cached_tokens,
        seq.num_preemptions,
        seq.finish_reason.value if seq.finish_reason is not None else None,
        seq.reject_reason,
        seq.token_times_s,
    )


def requests_to_arrow(rows: Iterable[tuple]) -> pa.Table:
    """Rows from ``request_row`` to a table with a ``token_times_s`` list column."""
    import numpy as np
    import pyarrow as pa

    rows = list(rows)
    columns = {}
    for i, (name, type_name) in enumerate(REQUEST_SCHEMA_FIELDS):
        columns[name] = pa.array([r[i] for r in rows], type=getattr(pa, type_name)())
    times = [r[-1] for r in rows]
    lengths = np.fromiter((len(t) for t in times), dtype=np.int64, count=len(times))
    offsets = np.zeros(len(times) + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([np.frombuffer(t, dtype=np.float64) for t in times]) if times else np.zeros(0)
    list_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    columns["token_times_s"] = list_type.from_arrays(pa.array(offsets), pa.array(flat, pa.float64()))
    return pa.table(columns)
