"""What a GPU replay's loop spends between steps: a least-squares fit over its step logs.

    python validation/loop_gaps.py RUN [RUN ...]

For each pair of consecutive steps on a replica where the engine went straight on (requests were left), the gap
is the next step's start minus this step's recorded end. It is fitted as a + b x (sequences in the step) + c x
(requests it finished) + d x (requests that arrived between the two starts, from requests.parquet): the loop's
fixed cost, the postprocess left outside the recorded duration (runs before durations included it), recording
finished requests and taking in new ones. The simulator counts all of it in the step (``sim.calibrate`` matches
periods); the fit says how much of the remaining error it could be.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.batch_features import went_straight_on  # noqa: E402
from sim.files import repeated_input_problem  # noqa: E402
from sim.run_kind import gpu_run_problem  # noqa: E402


def _read(path: Path, columns: list[str]):
    """``columns`` of a run's table; ValueError naming the file when it is damaged or lacks one (a pyarrow
    traceback, after the tables of the runs before it were printed)."""
    try:
        missing = [c for c in columns if c not in pq.read_schema(path).names]
        table = None if missing else pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: not a readable replay table ({reason})") from None
    if missing:
        raise ValueError(f"{path}: no column {missing[0]}; expected an engine.replay run's table")
    return table


def loop_gaps(run_dir: Path) -> dict:
    names = ["replica", "step", "start_s", "duration_s", "num_running", "num_waiting", "num_seqs", "num_finished"]
    steps = _read(run_dir / "steps.parquet", names).sort_by([("replica", "ascending"), ("step", "ascending")])
    col = {c: steps.column(c).to_numpy() for c in names}
    arrivals_s = np.sort(_read(run_dir / "requests.parquet", ["arrival_s"]).column("arrival_s").to_numpy())
    start, end = col["start_s"][:-1], col["start_s"][:-1] + col["duration_s"][:-1]
    went_on = went_straight_on(col["replica"], col["num_running"], col["num_waiting"])
    gap = (col["start_s"][1:] - end)[went_on]
    if not went_on.any():  # nothing to fit: NaN figures at exit 0
        raise ValueError(f"{run_dir / 'steps.parquet'}: no step the engine went straight on from (a step with requests "
                         "left, followed by another); expected a replay of more than one step")
    arrived = (np.searchsorted(arrivals_s, col["start_s"][1:], "right") - np.searchsorted(arrivals_s, start, "right"))
    x = np.column_stack([np.ones(went_on.sum()), col["num_seqs"][:-1][went_on], col["num_finished"][:-1][went_on],
                         arrived[went_on]])
    coef = np.linalg.lstsq(x, gap, rcond=None)[0]
    mean_step_s = float(np.mean(col["duration_s"][:-1][went_on] + gap))
    return {"run": run_dir.name, "gaps": int(went_on.sum()), "mean_gap_us": 1e6 * float(gap.mean()),
            "fixed_us": 1e6 * coef[0], "per_seq_us": 1e6 * coef[1], "per_finish_us": 1e6 * coef[2],
            "per_arrival_us": 1e6 * coef[3], "arrivals_per_step": float(arrived[went_on].mean()),
            "arrivals_share_of_step": float(coef[3] * arrived[went_on].mean() / mean_step_s)}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="engine.replay run folders")
    args = parser.parse_args(argv)
    twice = repeated_input_problem(args.runs, "run folder")  # the same run's row printed twice
    if twice:
        parser.exit(2, f"error: {twice}\n")
    for run in args.runs:
        for name in ("steps.parquet", "requests.parquet"):
            if not (Path(run) / name).is_file():
                parser.exit(2, f"error: {run}: no {name}; expected an engine.replay run folder\n")
        not_gpu = gpu_run_problem(Path(run))  # a simulation's gaps are the simulator's own loop model
        if not_gpu:
            parser.exit(2, f"error: {not_gpu}\n")
    try:  # every run read before the table's first line
        results = [loop_gaps(Path(run)) for run in args.runs]
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(f"{'run':<16}{'gaps':>7}{'mean us':>9}{'fixed us':>10}{'/seq us':>9}{'/finish us':>11}{'/arrival us':>12}"
          f"{'arrivals/step':>15}{'arrivals % of step':>20}")
    for r in results:
        print(f"{r['run']:<16}{r['gaps']:>7}{r['mean_gap_us']:>9.1f}{r['fixed_us']:>10.1f}{r['per_seq_us']:>9.2f}"
              f"{r['per_finish_us']:>11.1f}{r['per_arrival_us']:>12.1f}{r['arrivals_per_step']:>15.2f}"
              f"{100 * r['arrivals_share_of_step']:>19.2f}%")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
