"""Which run a run folder's files come from, so that a folder mixing two runs' files is refused by name.

The one run writer (``analysis.runs``) writes the same ``run_id`` into requests.parquet's and steps.parquet's
key-value metadata and into summary.json. A folder whose requests.parquet is one run's and whose steps.parquet or
summary.json is another's (a copy gone wrong) was read as one run: its summary, comparison and report mixed figures
of both. The id is a digest of the run's tables, not a random one: the same command writes the same bytes twice (the
simulator is deterministic, and outputs are compared across runs), and two runs whose tables are the same are one
run's files wherever they are copied. It is compared between files, never recomputed, so it needs to be
deterministic only, not stable across library versions. A file without one (written before run ids, or made by
hand) is not a disagreement: older folders are read as they were.

Here, not in analysis, so that sim.calibrate and sim.host_speed check a folder without importing analysis.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.files import read_json_input

# The parquet files' key-value metadata key, and summary.json's key, of the run id.
RUN_ID_KEY = "nanoserve.run_id"
SUMMARY_RUN_ID_KEY = "run_id"
# The files that carry it, in the order they are named.
RUN_ID_FILES = ("requests.parquet", "steps.parquet", "summary.json")


def parquet_run_id(path: Path) -> str | None:
    """The run id in the key-value metadata of the parquet file at ``path`` (pyarrow reads the footer alone); None
    where it has none or cannot be read (its reader names an unreadable file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_metadata(path).metadata or {}
    except (OSError, ValueError, pa.ArrowException):
        return None
    value = metadata.get(RUN_ID_KEY.encode())
    return value.decode(errors="replace") if value else None


def summary_run_id(path: Path) -> str | None:
    """summary.json's run id; None where it has none or cannot be read (its reader names an unreadable file)."""
    try:
        summary = json.loads(read_json_input(path))
    except (OSError, ValueError, RecursionError):
        return None
    value = summary.get(SUMMARY_RUN_ID_KEY) if isinstance(summary, dict) else None
    return value if isinstance(value, str) and value else None


def run_ids(run_dir: Path) -> dict[str, str]:
    """The run id of each of the folder's files that records one, by file name."""
    ids = {}
    for name in RUN_ID_FILES:
        path = Path(run_dir) / name
        if path.is_file():
            run_id = summary_run_id(path) if name.endswith(".json") else parquet_run_id(path)
            if run_id is not None:
                ids[name] = run_id
    return ids


def mixed_run_problem(run_dir: Path) -> str | None:
    """One line naming ``run_dir`` and its files of different runs, or None where they are one run's (or do not
    say: a folder written before run ids)."""
    ids = run_ids(run_dir)
    if len(set(ids.values())) <= 1:
        return None
    first_name, first_id = next(iter(ids.items()))
    other_name, other_id = next((name, run_id) for name, run_id in ids.items() if run_id != first_id)
    return (f"run folder {run_dir} mixes the files of different runs: {first_name} is of run {first_id}, "
            f"{other_name} of run {other_id}; expected one run's files (copy a run's folder whole, or rerun it)")
