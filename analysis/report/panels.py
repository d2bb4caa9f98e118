"""What a replay report draws from the step log, without plotly: ``analysis.runs`` keeps only these columns (and
the summary's) once steps.parquet is written, whether or not a report is asked for or plotly installed."""

from __future__ import annotations

from analysis.stats import MS_PER_S

# Step panels, y-axis title -> (steps column, scale), drawn by the replay report and by the comparison's.
QUEUE_PANELS: dict[str, tuple[str, float]] = {
    "running sequences": ("num_running", 1.0),
    "waiting sequences": ("num_waiting", 1.0),
}
KV_PANELS: dict[str, tuple[str, float]] = {"KV cache usage (%)": ("kv_usage", 100.0)}
TOKEN_PANELS: dict[str, tuple[str, float]] = {
    "prefill tokens per step": ("num_prefill_tokens", 1.0),
    "decode sequences per step": ("num_decode_seqs", 1.0),
    "step duration (ms)": ("duration_s", MS_PER_S),
}
# Histogram panels, x-axis title -> steps column.
BATCH_HISTOGRAMS: dict[str, str] = {
    "batched tokens per step (tokens)": "num_batched_tokens",
    "sequences per step (seqs)": "num_seqs",
}
# The panels' x axis, one series per replica.
STEP_TIME_COLUMN = "start_s"

# Every step column the report reads.
REPORT_STEP_INPUTS: tuple[str, ...] = tuple(dict.fromkeys((
    "replica", STEP_TIME_COLUMN,
    *(column for panels in (QUEUE_PANELS, KV_PANELS, TOKEN_PANELS) for column, _ in panels.values()),
    *BATCH_HISTOGRAMS.values(),
)))
