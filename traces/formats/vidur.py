"""Vidur simulator traces (Agrawal et al., MLSys 2024; microsoft/vidur data/processed_traces).

Columns `num_prefill_tokens`, `num_decode_tokens` and, in replay traces, `arrived_at`
(seconds); arrival = arrived_at - earliest arrived_at kept, as for the other formats. Without
`arrived_at` every request arrives at 0, unless `--qps` is given, in which case arrivals
are a seeded Poisson process at that rate. Requests with 0 prefill
or 0 decode tokens are dropped and counted. request_id is the 0-based data row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from traces.arrivals import arrival_times_s
from traces.errors import TraceError
from traces.formats.base import Converted, ConvertOptions, drop_zero_lengths, row_ids, time_origin
from traces.formats.tabular import float_column, int_column, read_csv_text
from traces.validation import MAX_ARRIVAL_S

REQUIRED_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


def read(path: Path, options: ConvertOptions) -> Converted:
    frame = read_csv_text(path, REQUIRED_COLUMNS, ("arrived_at",))
    recorded = "arrived_at" in frame.columns
    if recorded:
        arrivals = float_column(path, frame, "arrived_at", minimum=0.0, maximum=MAX_ARRIVAL_S)
    else:
        arrivals = pl.Series("arrival_s", np.zeros(frame.height))
    prompt_tokens = int_column(path, frame, "num_prefill_tokens")
    output_tokens = int_column(path, frame, "num_decode_tokens")
    if recorded:  # a file of wall-clock seconds starts at 0, as vidur replays it
        arrivals = arrivals - time_origin(arrivals.to_numpy(), prompt_tokens.to_numpy(), output_tokens.to_numpy())
    requests = pl.DataFrame(
        {
            "request_id": row_ids(frame.height),
            "arrival_s": arrivals,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
        }
    )
    requests, kept_before_drops, drop_note = drop_zero_lengths(requests, "request{s}")
    assigned = not recorded and options.qps is not None
    if assigned:
        if requests.height == 0:
            raise TraceError(f"{path}: every request was dropped; nothing to assign arrivals to")
        rng = np.random.default_rng(options.arrival_seed)
        requests = requests.with_columns(
            arrival_s=pl.Series(arrival_times_s(requests.height, options.qps, 1.0, rng))
        )
    return Converted(requests, kept_before_drops=kept_before_drops, drop_note=drop_note, arrivals_assigned=assigned)
