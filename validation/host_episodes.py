"""Is it the host? Per time window of a replay run with ``--step-timings``: host and GPU times of eager
and decode steps, and the GPU clocks sampled beside it (``validation/run_gpu.sh diagnose``).

    python validation/host_episodes.py DIAG_DIR [--window-s 2]

DIAG_DIR holds the replay folder (``b-azure-p70/``) and, if sampled, ``smi.csv`` (nvidia-smi).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.run_kind import gpu_run_problem  # noqa: E402


def window_table(steps: pl.DataFrame, window_s: float) -> pl.DataFrame:
    steps = steps.with_columns(
        (pl.col("start_s") // window_s * window_s).alias("t_s"), (pl.col("num_prefill_tokens") > 0).alias("eager")
    )
    eager = steps.filter(pl.col("eager")).group_by("t_s").agg(
        pl.len().alias("eager_steps"),
        pl.col("host_launch_ms").median().alias("eager_launch_ms"),
        pl.col("host_prepare_ms").median().alias("eager_prepare_ms"),
        pl.col("gpu_forward_ms").median().alias("eager_gpu_ms"),
    )
    decode = steps.filter(~pl.col("eager")).group_by("t_s").agg(
        pl.col("host_launch_ms").median().alias("decode_launch_ms"),
        pl.col("host_prepare_ms").median().alias("decode_prepare_ms"),
        pl.col("num_decode_seqs").median().alias("decode_batch"),
    )
    return eager.join(decode, on="t_s").sort("t_s")


def gpu_clocks(path: Path) -> dict[str, int]:
    """SM clock (MHz) -> number of samples."""
    counts: dict[str, int] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f, skipinitialspace=True):
            clock = row.get("clocks.current.sm [MHz]", "").strip()
            counts[clock] = counts.get(clock, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("diag", help="folder with the replay run (with --step-timings) and smi.csv")
    parser.add_argument("--window-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    if not 0 < args.window_s < float("inf"):  # 0, NaN or inf was an IndexError traceback, a negative one a wrong table
        parser.exit(2, f"error: --window-s must be a finite number of seconds > 0, got {args.window_s}\n")
    diag = Path(args.diag)
    runs = [p.parent for p in diag.glob("*/steps.parquet")]
    if not runs:
        parser.exit(2, f"error: no */steps.parquet under {diag}\n")
    not_gpu = gpu_run_problem(runs[0])  # its host and GPU times would be the cost model's
    if not_gpu:
        parser.exit(2, f"error: {not_gpu}\n")
    try:
        steps = pl.read_parquet(runs[0] / "steps.parquet")
    except (OSError, pl.exceptions.PolarsError) as exc:  # a damaged table was a polars traceback
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        parser.exit(2, f"error: {runs[0] / 'steps.parquet'}: not a readable replay table ({reason})\n")
    if "host_launch_ms" not in steps.columns:
        parser.exit(2, f"error: {runs[0]} was not replayed with --step-timings\n")
    missing = [c for c in ("start_s", "num_prefill_tokens", "num_decode_seqs", "host_prepare_ms", "gpu_forward_ms")
               if c not in steps.columns]
    if missing:  # a ColumnNotFoundError traceback
        parser.exit(2, f"error: {runs[0] / 'steps.parquet'}: no column {missing[0]}; expected an engine.replay step "
                       "log with --step-timings\n")
    table = window_table(steps, args.window_s)
    if table.is_empty():  # np.percentile's IndexError traceback
        parser.exit(2, f"error: {runs[0]}: no {args.window_s:g}-s window holds both eager and decode steps; nothing to "
                       "compare (a longer --window-s?)\n")
    with pl.Config(tbl_rows=200, tbl_cols=20, float_precision=2):
        print(table)
    launch = table["eager_launch_ms"].to_numpy()
    fast = np.median(launch[launch <= np.percentile(launch, 50)])
    slow = table.filter(pl.col("eager_launch_ms") > 1.3 * fast)
    corr = np.corrcoef(table["eager_launch_ms"].to_numpy(), table["decode_launch_ms"].to_numpy())[0, 1]
    print(f"eager launch: {fast:.1f} ms in the faster half of windows; {slow.height} of {table.height} windows "
          f"over 1.3x that (median {slow['eager_launch_ms'].median() or 0:.1f} ms); "
          f"correlation of eager and decode-graph launch times "
          f"across windows {corr:.2f}")
    if (diag / "smi.csv").is_file():
        print("GPU SM clock samples (MHz: count):", gpu_clocks(diag / "smi.csv"))
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
