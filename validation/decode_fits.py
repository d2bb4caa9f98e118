"""Alternatives to the decode calibration, fitted on calibration runs and judged on validation runs:
``python validation/decode_fits.py RUN [RUN ...] --calibration CAL_RUN [CAL_RUN ...] [--profile P]``.

The shipped calibration scales every CUDA-graph decode step by one factor (``sim.calibrate``). This fits, on the
calibration runs' decode steps (their periods, as ``sim.calibrate`` reads them) priced by the profile's grid:
- ``k``: that one factor;
- ``k, slope``: the factor times 1 + slope * (batch - mean batch), the mean weighted by predicted time, so that the
  calibration runs' total stays k's;
- ``3 terms``: separate factors on the grid's per-batch intercept, its context term and its skew term;
and prints each run's predicted over real decode time under each, overall and per band of 16 sequences. It also
fits the loop's work between steps: the decode residual (real - k * grid) against the requests that arrive during a
step's period and the sequences that finish in it. Needs the GPU runs' folders (engine.replay outputs).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser, nonempty  # noqa: E402
from sim.batch_features import read_steps  # noqa: E402
from sim.files import repeated_input_problem  # noqa: E402
from sim.profiled_cost_model import (  # noqa: E402
    ProfiledCostModel,
    _excess_context,
    _is_graph_step,
)
from sim.run_kind import gpu_run_problem  # noqa: E402
from validation.step_errors import profile_option, uncalibrated_grid  # noqa: E402

BATCH_BAND = 16


def decode_steps(run: Path, grid: ProfiledCostModel) -> np.ndarray:
    """One row per decode step: intercept, context and skew parts of its grid time, batch size, real period,
    arrivals during the period, finishes in the step."""
    import polars as pl

    try:  # a damaged table or one without the column was a polars traceback
        name = "requests.parquet"
        arrivals = np.sort(pl.read_parquet(run / name, columns=["arrival_s"])["arrival_s"].to_numpy())
        name = "steps.parquet"
        steps = pl.read_parquet(run / name, columns=["start_s", "num_finished"])
    except (OSError, pl.exceptions.PolarsError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{run / name}: not a readable replay table ({reason})") from None
    finished = dict(zip(steps["start_s"].to_list(), steps["num_finished"].to_list()))
    rows = []
    for f, real_s, start_s in read_steps(run, periods=True):
        if not _is_graph_step(f, grid.max_graph_bs):
            continue
        bs, kv, longest = f["num_decode_seqs"], f["decode_context_tokens"], f.get("max_decode_context_tokens", 0)
        intercept = grid._decode_a[bs] + (0.0 if f.get("continues_batch", 1) else grid._unprepared_s[bs])
        skew = grid._per_excess_s[bs] * _excess_context(bs, kv, longest) if grid._per_excess_s[bs] else 0.0
        num_arrived = np.searchsorted(arrivals, start_s + real_s) - np.searchsorted(arrivals, start_s)
        rows.append((intercept, grid._decode_b[bs] * kv, skew, bs, real_s, num_arrived, finished.get(start_s, 0)))
    return np.array(rows, dtype=float).reshape(-1, 7)


def ratios(name: str, predicted: np.ndarray, rows: np.ndarray) -> str:
    bs, real = rows[:, 3], rows[:, 4]
    bands = []
    for lo in range(0, int(bs.max()) + 1, BATCH_BAND):
        sel = (bs >= lo) & (bs < lo + BATCH_BAND)
        if sel.sum() > 50:  # fewer steps say little
            bands.append(f"{lo}-{lo + BATCH_BAND - 1}: {predicted[sel].sum() / real[sel].sum():.3f}")
    return f"  {name:8s} all {predicted.sum() / real.sum():.3f}   " + ", ".join(bands)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    # Read as typed, then made Paths: Path("") is ".", a run folder nobody typed (".: no requests.parquet").
    parser.add_argument("runs", nargs="+", help="validation GPU runs (engine.replay folders)")
    parser.add_argument("--calibration", nargs="+", type=nonempty, required=True, help="calibration GPU runs")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the shipped qwen3-0.6b)")
    args = parser.parse_args(argv)
    args.runs, args.calibration = [Path(run) for run in args.runs], [Path(run) for run in args.calibration]
    # A calibration run given twice weighed its steps double in the fits; a validation run, its lines printed twice.
    # (One run in both lists is allowed: its validation lines are the in-sample ones.)
    twice = repeated_input_problem(args.calibration, "--calibration") or repeated_input_problem(args.runs, "run")
    if twice:
        parser.exit(2, f"error: {twice}\n")
    # Bad input is one line and exit 2: a missing, empty or garbled profile (or a folder) was a traceback.
    for run in [*args.calibration, *args.runs]:
        missing = next((name for name in ("requests.parquet", "steps.parquet") if not (run / name).is_file()), None)
        if missing:
            parser.exit(2, f"error: {run}: no {missing}; expected an engine.replay run folder\n")
        not_gpu = gpu_run_problem(run)  # a simulation's decode steps are the fitted model's own: ratios of 1.000
        if not_gpu:
            parser.exit(2, f"error: {not_gpu}\n")
    path = profile_option(parser, args.profile)
    try:
        grid = uncalibrated_grid(path)
        cal_rows = [decode_steps(run, grid) for run in args.calibration]
        cal = np.vstack(cal_rows)
        if not len(cal):  # k and the fits were NaN, and the ratios a traceback
            raise ValueError(f"--calibration {' '.join(map(str, args.calibration))}: no CUDA-graph decode step to "
                             "fit on; expected GPU runs that decoded")
        validation = [(run, decode_steps(run, grid)) for run in args.runs]
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    parts, bs, real = cal[:, :3], cal[:, 3], cal[:, 4]
    pred = parts.sum(axis=1)
    k = real.sum() / pred.sum()
    ref = (pred * bs).sum() / pred.sum()
    x, y = k * pred * (bs - ref), real - k * pred
    slope = (x * y).sum() / (x * x).sum()
    terms = np.linalg.lstsq(parts, real, rcond=None)[0]
    loop = np.linalg.lstsq(np.column_stack([cal[:, 5], cal[:, 6]]), real - k * pred, rcond=None)[0]
    print(f"fitted on {', '.join(r.name for r in args.calibration)} ({len(cal)} decode steps): k {k:.4f}; slope "
          f"{100 * slope:.3f} % a sequence about a mean batch of {ref:.1f}; 3 terms {np.round(terms, 3).tolist()}; "
          f"loop work {1e6 * loop[0]:.0f} us per arrival, {1e6 * loop[1]:.0f} us per finish")
    for run, rows in [*zip(args.calibration, cal_rows), *validation]:
        p, b = rows[:, :3].sum(axis=1), rows[:, 3]
        print(f"{run.name}: {len(rows)} decode steps, predicted / real")
        if not len(rows):
            continue
        print(ratios("k", k * p, rows))
        print(ratios("k, slope", k * p * (1 + slope * (b - ref)), rows))
        print(ratios("3 terms", rows[:, :3] @ terms, rows))
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
