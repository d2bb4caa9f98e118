"""Where the cost model misses: the measured profile's prediction for every step of a GPU run.

    python validation/step_errors.py validation/runs/real/b-azure-p70 [...]

A step's real time is its period where the engine went straight on to another step (to the next step's
start: the loop's work after the recorded end belongs to it), as ``sim.calibrate`` matches it.
Steps are split into eager steps (any prefill), decode steps that do not repeat the batch before them
(after a prefill, a finish or a preemption: the engine plans them while they run), and the remaining
decode steps (planned during the step before; ``continues_batch``). For each class it prints the real and
predicted mean durations and their ratio, so a latency error can be traced to a kind of step.
Runs recorded before steps.parquet had ``prefill_attention_pairs`` get it estimated from equal chunks.
The profile's serving calibration applies (its averages), as in ``sim.replay``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from sim.batch_features import FEATURE_NAMES, derive_continues_batch  # noqa: E402
from sim.profiled_cost_model import ProfiledCostModel, find_profile  # noqa: E402


def with_pairs(steps: pl.DataFrame) -> pl.DataFrame:
    if "prefill_attention_pairs" in steps.columns:
        return steps
    n = pl.col("num_prefill_seqs").clip(1, None)
    q = pl.col("num_prefill_tokens") / n
    pairs = pl.col("num_prefill_tokens") * pl.col("prefill_context_tokens") / n + n * q * (q + 1) / 2
    return steps.with_columns(pl.when(pl.col("num_prefill_seqs") > 0).then(pairs).otherwise(0)
                              .alias("prefill_attention_pairs"))


def step_errors(run_dir: Path, model: ProfiledCostModel) -> list[dict]:
    steps = with_pairs(pl.read_parquet(run_dir / "steps.parquet").sort("replica", "step"))
    if "continues_batch" not in steps.columns:  # recorded before the column
        derived = derive_continues_batch(*(steps[c].to_numpy() for c in (
            "replica", "num_seqs", "num_prefill_seqs", "num_preempted", "num_finished")))
        steps = steps.with_columns(pl.Series("continues_batch", derived))
    # A step's real time is its period where the engine went straight on (as sim.calibrate matches it): the
    # loop's work after the recorded end, until the next step starts, is time the simulator counts in the step.
    next_start = pl.col("start_s").shift(-1).over("replica")
    busy = (pl.col("num_running") + pl.col("num_waiting") > 0) & next_start.is_not_null()
    period = pl.max_horizontal(next_start - pl.col("start_s"), pl.col("duration_s"))
    steps = steps.with_columns(pl.when(busy).then(period).otherwise(pl.col("duration_s")).alias("duration_s"))
    eager = pl.col("num_prefill_tokens") > 0
    names = [c for c in FEATURE_NAMES if c in steps.columns]  # runs recorded before a feature existed lack it
    predicted = np.array([model.predict({k: row[k] for k in names}) for row in steps.iter_rows(named=True)])
    steps = steps.with_columns(pl.Series("predicted_s", predicted))
    rows = []
    continues = pl.col("continues_batch") == 1
    for label, condition in (("eager", eager), ("decode, new batch", ~eager & ~continues),
                             ("decode, same batch", ~eager & continues), ("all", pl.lit(True))):
        part = steps.filter(condition)
        if part.height:
            real, pred = part["duration_s"].sum(), part["predicted_s"].sum()
            rows.append({"run": run_dir.name, "steps": label, "count": part.height,
                         "real_ms": 1e3 * real / part.height, "predicted_ms": 1e3 * pred / part.height,
                         "predicted_over_real": pred / real})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="GPU replay folders")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the shipped h200 qwen3-0.6b one)")
    args = parser.parse_args(argv)
    missing = [run for run in args.runs if not (Path(run) / "steps.parquet").is_file()]
    if missing:  # a polars FileNotFoundError traceback
        parser.exit(2, f"error: {missing[0]}: no steps.parquet; expected an engine.replay run folder\n")
    model = ProfiledCostModel.load(Path(args.profile) if args.profile else find_profile("qwen3-0.6b", "h200"))
    print(f"{'run':<16}{'steps':<20}{'count':>7}{'real ms':>10}{'pred ms':>10}{'pred/real':>11}")
    for run in args.runs:
        for r in step_errors(Path(run), model):
            print(f"{r['run']:<16}{r['steps']:<20}{r['count']:>7}{r['real_ms']:>10.2f}{r['predicted_ms']:>10.2f}"
                  f"{r['predicted_over_real']:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
