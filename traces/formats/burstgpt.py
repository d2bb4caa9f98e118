"""BurstGPT traces (Wang et al., arXiv:2401.17644; github.com/HPMLL/BurstGPT).

Columns `Timestamp` (seconds from 0:00 of the first day), `Model` (ChatGPT or GPT-4),
`Request tokens`, `Response tokens`, `Total tokens`, `Log Type` (Conversation log or API
log). Rows with 0 response tokens are failed requests and are dropped (and counted), as
are rows with 0 request tokens. Arrival = Timestamp - earliest Timestamp of a request kept,
after a stable sort. `Model` and `Log Type` are kept as the extra columns `model` and `log_type` so a
replay can select one service. request_id is the 0-based data row in the CSV.

Release v1.2's `BurstGPT_3.csv` adds `Session ID` (a UUID shared by the turns of one
conversation, empty for API calls) after `Timestamp`, and `Elapsed time` (seconds from
submission to the complete response, as the service measured it). They are kept as
`session_id` (null where empty, so each API call is a session of its own, as
analysis.capacity reads it) and `elapsed_s` (null where empty).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traces.formats.base import Converted, ConvertOptions, drop_zero_lengths, row_ids, time_origin
from traces.formats.tabular import float_column, int_column, read_csv_text
from traces.validation import MAX_ARRIVAL_S

REQUIRED_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_EXTRAS = {"Model": "model", "Log Type": "log_type"}
SESSION_COLUMN = "Session ID"
ELAPSED_COLUMN = "Elapsed time"


def _sessions(frame: pl.DataFrame) -> list[pl.Series]:
    """`session_id` from `Session ID` when the file has it (empty for API calls, which belong to no conversation)."""
    if SESSION_COLUMN not in frame.columns:
        return []
    ids = frame[SESSION_COLUMN]
    return [ids.set((ids == "").fill_null(False), None).alias("session_id")]


def _elapsed(path: Path, frame: pl.DataFrame) -> list[pl.Series]:
    """`elapsed_s`, the service's own end-to-end time of each request, when the file has `Elapsed time`."""
    if ELAPSED_COLUMN not in frame.columns:
        return []
    return [float_column(path, frame, ELAPSED_COLUMN, minimum=0.0, optional=True).alias("elapsed_s")]


def read(path: Path, options: ConvertOptions) -> Converted:
    frame = read_csv_text(
        path, REQUIRED_COLUMNS,
        ("Model", "Total tokens", "Log Type", SESSION_COLUMN, ELAPSED_COLUMN),
    )
    requests = pl.DataFrame(
        {
            "request_id": row_ids(frame.height),
            "arrival_s": float_column(path, frame, "Timestamp", minimum=0.0, maximum=MAX_ARRIVAL_S),
            "prompt_tokens": int_column(path, frame, "Request tokens"),
            "output_tokens": int_column(path, frame, "Response tokens"),
        }
    ).hstack([frame[source].alias(name) for source, name in _EXTRAS.items() if source in frame.columns]
             + _sessions(frame) + _elapsed(path, frame))
    origin_s = time_origin(*(requests[name].to_numpy() for name in ("arrival_s", "prompt_tokens", "output_tokens")))
    requests = requests.with_columns(pl.col("arrival_s") - origin_s)
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "request{s} (0 response tokens are failures)")
    return Converted(requests, kept_before_drops=kept_before_drops, drop_note=drop_note)
