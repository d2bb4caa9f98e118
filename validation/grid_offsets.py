"""Do the profiled cost model's fits under-price their own grid points? Per profile and regime, the offsets
sim.bands draws from: each grid point's measured median over the fit's price, minus one.

    python validation/grid_offsets.py [--runs GPU:RESULTS ...] [--traces DIR]

Per regime (CUDA-graph decode; prefill/mixed, "eager"): the offsets' mean and median over the grid points, then
their mean weighted by the steps of sim.replay's replays of the validation runs committed in each RESULTS folder
(each run of validation/compare_all.py's plan with a ``<run>/real_summary.json``, its options, that run's KV block
count and ``--gpu GPU``): each simulated step counts for the grid point of its regime nearest it (NEAREST_FEATURES,
log scale), by its number ("steps") and by its simulated time ("time"). The points are those the bands draw from
(``sim.bands.band_points``); the column "left out" counts the profile's points marked as timing artifacts. Then the
points with the largest |offset| and the share of the replays' steps nearest them: a mean moved by a point the traces
hardly meet is no bias of the steps they run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser, nonempty  # noqa: E402

# The folders of the current engine's GPU runs that validation/results/fidelity-summary-current.md reads.
CURRENT_RUNS = ("h200:validation/results/h200-session35-2026-12-06/shipped",
                "h200:validation/results/h200-session35-2026-12-06/start2-shipped",
                "h100:validation/results/h100-longctx-session41",
                "h100:validation/results/h100-longout-session43")
MODEL = "qwen3-0.6b"  # the model of every run in those folders
# A step's nearest grid point is found on these features, each as log2(1 + value): the grid's families vary the
# prompt's tokens, the prefills in a step, their cached context, the decode rows, their context and its longest one
# ('decode_skewed'), and whether a decode step repeats the batch before it ('decode_after_eager' does not).
NEAREST_FEATURES = ("num_prefill_tokens", "num_prefill_seqs", "prefill_context_tokens", "num_decode_seqs",
                    "decode_context_tokens", "max_decode_context_tokens", "continues_batch")
SHAPE_FEATURES = NEAREST_FEATURES[:5]  # those that name a grid point's shape in the outliers' lines
NUM_OUTLIERS = 3  # per profile and regime


def _runs_option(text: str) -> tuple[str, Path]:
    gpu, sep, results = text.partition(":")
    if not sep or not gpu or not results:
        raise ValueError(f"expected GPU:RESULTS (h200:validation/results/...), got {text!r}")
    return gpu.lower(), Path(results)


def _log_features(columns: dict) -> np.ndarray:
    return np.log2(1.0 + np.column_stack([np.asarray(columns[name], dtype=float) for name in NEAREST_FEATURES]))


def nearest_counts(points: list[dict], steps: dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Per grid point, the summed ``weights`` of the ``steps`` (columns by feature name) nearest it."""
    grid = _log_features({name: [p["features"][name] for p in points] for name in NEAREST_FEATURES})
    stepped = _log_features(steps)
    nearest = np.empty(len(stepped), dtype=np.int64)
    for start in range(0, len(stepped), 4096):  # a block of steps at a time: a steps x points x features array
        block = stepped[start:start + 4096]
        nearest[start:start + len(block)] = ((block[:, None, :] - grid[None, :, :]) ** 2).sum(axis=2).argmin(axis=1)
    return np.bincount(nearest, weights=weights, minlength=len(points))


def planned_runs(results: Path) -> list[tuple[str, list[str]]]:
    """(planned run, its GPU runs) for each run of the plan with a committed GPU summary in ``results``."""
    from validation.band_check import _gpu_runs
    from validation.compare_all import PLAN

    return [(name, made) for name in PLAN if (made := _gpu_runs(results, name))]


def replayed_steps(folders: list[Path], traces: Path, gpu: str) -> dict[str, np.ndarray]:
    """The steps of one replay of each planned run of ``folders`` made on ``gpu`` (with its first GPU run's KV block
    count), their columns concatenated."""
    import polars as pl

    from cli.sim_replay import main as sim_replay
    from validation.band_check import _read_summary
    from validation.compare_all import PLAN

    frames = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (results, name, made) in enumerate((r, n, m) for r in folders for n, m in planned_runs(r)):
            blocks = _read_summary(results / made[0] / "real_summary.json")["config"]["num_gpu_blocks"]
            _, trace, options = PLAN[name]
            out = Path(tmp) / f"{index}-{name}"  # a planned run may be in several folders
            sim_replay([str(traces / trace), *options, "--gpu", gpu, "--num-gpu-blocks", str(blocks),
                        "--out", str(out), "--quiet", "--no-report"])
            frames.append(pl.read_parquet(out / "steps.parquet", columns=[*NEAREST_FEATURES, "duration_s"]))
    steps = pl.concat(frames)
    return {name: steps[name].to_numpy() for name in steps.columns}


def _weighted(offsets: np.ndarray, weights: np.ndarray) -> str:
    return f"{np.average(offsets, weights=weights):+.2%}" if weights.sum() > 0 else "n/a"


def offset_lines(gpu: str, profile: dict, steps: dict[str, np.ndarray]) -> tuple[list[str], list[str]]:
    """(the offsets table's rows of ``gpu``'s ``profile`` against the replayed ``steps``, the lines of its largest
    offsets)."""
    from sim.bands import band_points, grid_model, grid_offset
    from sim.profiled_cost_model import _is_graph_step

    grid = grid_model(profile["fit"])
    points = band_points(profile)
    left_out = [p for p in profile["points"] if p not in points]
    is_decode = np.array([_is_graph_step(p["features"], grid.max_graph_bs) for p in points])
    step_is_decode = np.fromiter(
        (_is_graph_step({"num_prefill_tokens": prefill, "num_decode_seqs": decode}, grid.max_graph_bs)
         for prefill, decode in zip(steps["num_prefill_tokens"].tolist(), steps["num_decode_seqs"].tolist())),
        dtype=bool, count=len(steps["num_prefill_tokens"]))
    rows, outliers = [], []
    for regime, decode in (("decode", True), ("eager", False)):
        mine = [p for p, d in zip(points, is_decode, strict=True) if d == decode]
        num_left_out = sum(_is_graph_step(p["features"], grid.max_graph_bs) == decode for p in left_out)
        offsets = np.array([grid_offset(grid, p) for p in mine])
        taken = {name: values[step_is_decode == decode] for name, values in steps.items()}
        by_count = nearest_counts(mine, taken, np.ones(len(taken["duration_s"])))
        by_time = nearest_counts(mine, taken, taken["duration_s"])
        rows.append(f"| {gpu} | {regime} | {len(mine)} | {offsets.mean():+.2%} | {np.median(offsets):+.2%} | "
                    f"{_weighted(offsets, by_count)} | {_weighted(offsets, by_time)} | {num_left_out} | "
                    f"{len(taken['duration_s'])} |")
        for i in np.argsort(-np.abs(offsets), kind="stable")[:NUM_OUTLIERS]:
            f = mine[i]["features"]
            shape = ", ".join(f"{name} {f[name]}" for name in SHAPE_FEATURES if f[name])
            share = f"{by_count[i] / by_count.sum():.2%}" if by_count.sum() else "none"
            outliers.append(f"- {gpu} {regime} {mine[i]['family']} ({shape}): {offsets[i]:+.1%}; the others' mean "
                            f"{np.delete(offsets, i).mean():+.2%}; nearest to {share} of the regime's replayed steps")
    return rows, outliers


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", action="append", metavar="GPU:RESULTS",
                        help="a folder of committed GPU summaries and the GPU they ran on; repeat for several "
                             "(default: the four folders of the current engine's runs)")
    from validation.compare_all import TRACES

    parser.add_argument("--traces", type=nonempty, default=str(TRACES), help="the validation traces' folder")
    args = parser.parse_args(argv)
    try:
        runs = [_runs_option(text) for text in args.runs or CURRENT_RUNS]
    except ValueError as exc:
        parser.exit(2, f"error: --runs: {exc}\n")
    from sim.profiled_cost_model import find_profile

    # Every folder and profile checked before the first replay.
    for gpu, results in runs:
        if not planned_runs(results):
            parser.exit(2, f"error: --runs {gpu}:{results}: no <run>/real_summary.json of a planned run; expected a "
                           "folder of committed GPU summaries\n")
        if find_profile(MODEL, gpu) is None:
            parser.exit(2, f"error: --runs {gpu}:{results}: no shipped {MODEL} profile for GPU {gpu!r}\n")
    rows, outliers = [], []
    for gpu in dict.fromkeys(gpu for gpu, _ in runs):
        profile = json.loads(find_profile(MODEL, gpu).read_text())
        steps = replayed_steps([results for g, results in runs if g == gpu], Path(args.traces), gpu)
        table, lines = offset_lines(gpu, profile, steps)
        rows += table
        outliers += lines
    print("| profile | regime | grid points | mean offset | median offset | mean by steps | mean by time | "
          "left out | replayed steps |\n|:---|:---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows) + "\n\nLargest |offset| per profile and regime:\n" + "\n".join(outliers))
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
