"""BurstGPT traces (Wang et al., arXiv:2401.17644; github.com/HPMLL/BurstGPT).

Columns `Timestamp` (seconds from 0:00 of the first day), `Model` (ChatGPT or GPT-4),
`Request tokens`, `Response tokens`, `Total tokens`, `Log Type` (Conversation log or API
log). Rows with 0 response tokens are failed requests and are dropped (and counted), as
are rows with 0 request tokens. Arrival = Timestamp - earliest Timestamp after a stable
sort. `Model` and `Log Type` are kept as the extra columns `model` and `log_type` so a
replay can select one service. request_id is the 0-based data row in the CSV.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traces.formats.base import Converted, ConvertOptions, drop_zero_lengths, row_ids
from traces.formats.tabular import float_column, int_column, read_csv_text
from traces.validation import MAX_ARRIVAL_S

_EXTRAS = {"Model": "model", "Log Type": "log_type"}


def read(path: Path, options: ConvertOptions) -> Converted:
    frame = read_csv_text(
        path, ("Timestamp", "Request tokens", "Response tokens"), ("Model", "Total tokens", "Log Type")
    )
    requests = pl.DataFrame(
        {
            "request_id": row_ids(frame.height),
            "arrival_s": float_column(path, frame, "Timestamp", minimum=0.0, maximum=MAX_ARRIVAL_S),
            "prompt_tokens": int_column(path, frame, "Request tokens"),
            "output_tokens": int_column(path, frame, "Response tokens"),
        }
    ).hstack([frame[source].alias(name) for source, name in _EXTRAS.items() if source in frame.columns])
    requests = requests.with_columns(pl.col("arrival_s") - pl.col("arrival_s").min())
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "requests (0 response tokens are failures)")
    return Converted(requests, kept_before_drops=kept_before_drops, drop_note=drop_note)
