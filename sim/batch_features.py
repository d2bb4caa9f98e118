"""What a step's cost depends on, read off a ScheduledBatch or a recorded step log (shared by the
profiler, the cost models and their calibration)."""

from __future__ import annotations

from pathlib import Path

from engine.core.records import BATCH_COLUMNS
from engine.core.scheduler import ScheduledBatch

FEATURE_NAMES = BATCH_COLUMNS  # every batch column of the step log, read off the batch by name


def batch_features(batch: ScheduledBatch) -> dict[str, int]:
    return {name: getattr(batch, name) for name in FEATURE_NAMES}


def read_steps(run_dir: Path) -> list[tuple[dict, float, float]]:
    """(features, duration_s, start_s) for every step of a replay's ``steps.parquet``."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "steps.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no steps.parquet (expected an engine.replay output folder)")
    table = pq.read_table(path)
    needed = FEATURE_NAMES + ("duration_s", "start_s")
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {', '.join(missing)} (recorded by an older engine?)")
    columns = {c: table.column(c).to_pylist() for c in needed}
    return [
        ({c: columns[c][i] for c in FEATURE_NAMES}, columns["duration_s"][i], columns["start_s"][i])
        for i in range(table.num_rows)
    ]
