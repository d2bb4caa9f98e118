"""Where the cost model misses: the measured profile's prediction for every step of a GPU run.

    python validation/step_errors.py validation/runs/real/b-azure-p70 [...]

Steps are read as ``sim.calibrate`` reads them (``sim.batch_features.read_steps`` with periods): a step's real
time is its period where the engine went straight on to another step, and runs recorded before
``continues_batch`` get it rebuilt. Steps are split into eager steps (any prefill), decode steps that do not
repeat the batch before them (after a prefill, a finish or a preemption: the engine plans them while they run),
and the remaining decode steps (planned during the step before). For each class it prints the real and
predicted mean durations and their ratio, so a latency error can be traced to a kind of step.
The profile's serving calibration applies (its averages), as in ``sim.replay``. A run whose requests sampled
(summary.json's config: temperature, top_k, top_p) is priced with what the profile measured that sampling to add, as
``sim.replay`` prices it; its label says how it sampled. Priced as greedy, the thirtieth session's sampled runs
read 0.72 of their real step time where the greedy run beside them read 0.97.

``--split-finishing`` splits the same-batch decode steps by whether a row reaches its length limit in the step
(the step log's num_finished): the GPU runner launches the next step ahead during a step only where no row finishes
(``ModelRunner._may_run_ahead``), so such a step does not pay that launch and read 0.1-0.35 ms shorter than its
neighbours on an H100 (the thirty-third session), where the profile's repeat extra prices both alike.

``--bucket-fit`` instead fits the runs' decode steps that repeat their batch, by their durations (the engine's own
time, without the loop's work between steps), per CUDA-graph bucket as a + b x (KV tokens read), and prints a and b
beside the profile grid's (before serving factors): a per-step cost that differs while b agrees is a constant per
step, not a factor.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from analysis.runs import read_meta  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.batch_features import read_steps  # noqa: E402
from sim.calibrate import check_measured_durations  # noqa: E402
from sim.files import repeated_input_problem  # noqa: E402
from sim.profiled_cost_model import ProfiledCostModel, _is_graph_step, find_profile, fit_profile, read_profile  # noqa: E402,E501
from sim.run_kind import gpu_run_problem  # noqa: E402

CLASSES = ("eager", "decode, new batch", "decode, same batch", "decode, same batch, a row finishes")


def _class(f: dict, finishes: bool = False) -> int:
    """The step's index in CLASSES (``finishes``: a row of the step finished, asked only with --split-finishing)."""
    if f["num_prefill_tokens"]:
        return 0
    if not f["continues_batch"]:
        return 1
    return 3 if finishes else 2


def _key(f: dict, batch_bin: int, context_bin: int, finishes: bool = False) -> tuple[int, int, int]:
    """(class, lowest batch size of its bin, lowest mean decode context of its bin); -1 where not split."""
    seqs = f["num_seqs"] // batch_bin * batch_bin if batch_bin else -1
    mean_context = f["decode_context_tokens"] // f["num_decode_seqs"] if f["num_decode_seqs"] else 0
    return _class(f, finishes), seqs, (mean_context // context_bin * context_bin if context_bin else -1)


def finished_counts(run_dir: Path, num_steps: int) -> list[int]:
    """Each step's num_finished, in read_steps' order: the log's own (a run writes its steps in key order, which this
    checks, as read_steps keeps it where the log has continues_batch); ValueError naming the file otherwise."""
    from sim.files import read_parquet_table

    path = Path(run_dir) / "steps.parquet"
    table = read_parquet_table(path, ["replica", "step", "num_finished"])
    keys = list(zip(table.column("replica").to_pylist(), table.column("step").to_pylist()))
    counts = table.column("num_finished").to_pylist()
    if len(counts) != num_steps or any(b <= a for a, b in zip(keys, keys[1:])) or None in counts:
        raise ValueError(f"{path}: --split-finishing expected steps in (replica, step) order with num_finished on "
                         "every row")
    return counts


def _label(key: tuple[int, int, int], batch_bin: int, context_bin: int) -> str:
    cls, seqs, context = key
    if cls == len(CLASSES):
        return "all"
    parts = [CLASSES[cls]]
    if seqs >= 0:
        parts.append(f"{seqs}-{seqs + batch_bin - 1} seqs")
    if context >= 0:
        parts.append(f"mean context {context}-{context + context_bin - 1}")
    return ", ".join(parts)


def run_sampling(run_dir: Path) -> str:
    """How the run's requests sampled ('greedy', 'temperature' or 'filters': SimConfig.sampling_mode), from its
    summary.json's config; 'greedy' where it records no temperature (runs recorded before the option).
    ValueError naming the file for a config the simulator would refuse."""
    from sim.config import SimConfig

    config = read_meta(run_dir).get("config") or {}
    options = {name: config[name] for name in ("temperature", "top_k", "top_p") if config.get(name) is not None}
    if "temperature" not in options:
        return "greedy"
    try:
        sim_config = SimConfig(model=config.get("model") or SimConfig().model, **options)
        return sim_config.sampling_mode(sim_config.model_shape.vocab_size)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{run_dir / 'summary.json'}: config: {exc}") from None


def step_errors(run_dir: Path, model: ProfiledCostModel, batch_bin: int = 0, context_bin: int = 0,
                split_finishing: bool = False) -> list[dict]:
    """Per class (and bin) of the run's steps, then the whole run: count, mean real and predicted ms, their ratio.
    ``model`` prices the sampling the run's requests took (``run_sampling``)."""
    whole = (len(CLASSES), -1, -1)
    sums: dict[tuple, list] = {}  # count, real s, predicted s
    steps = read_steps(run_dir, periods=True)
    if not steps:  # the table printed its header alone, at exit 0
        raise ValueError(f"{Path(run_dir) / 'steps.parquet'}: no steps (0 rows); expected the step log of a GPU run")
    check_measured_durations(run_dir)  # read_steps takes 0 s: a class of such steps divided by zero (a traceback)
    finished = finished_counts(run_dir, len(steps)) if split_finishing else [0] * len(steps)
    for (f, real_s, _), num_finished in zip(steps, finished):
        predicted_s = model.predict(f)
        for key in (_key(f, batch_bin, context_bin, num_finished > 0), whole):
            part = sums.setdefault(key, [0, 0.0, 0.0])
            part[0] += 1
            part[1] += real_s
            part[2] += predicted_s
    name = run_dir.name if model.sampling == "greedy" else f"{run_dir.name} ({model.sampling})"
    return [{"run": name, "steps": _label(key, batch_bin, context_bin), "count": count,
             "real_ms": 1e3 * real / count, "predicted_ms": 1e3 * pred / count, "predicted_over_real": pred / real}
            for key, (count, real, pred) in sorted(sums.items())]  # classes in order, bins ascending, the run last


MIN_BUCKET_STEPS = 50  # fewer steps in a bucket give no usable line


def bucket_fits(run_dirs: list[Path], grid: ProfiledCostModel) -> list[dict]:
    """Per CUDA-graph bucket of the runs' same-batch decode steps: count, real a (ms) and b (ns per KV token) by
    least squares on their durations, the grid's a and b, and the mean real and grid step time (ms)."""
    steps = np.array([(f["num_decode_seqs"], f["decode_context_tokens"], real_s)
                      for run in run_dirs for f, real_s, _ in read_steps(run, periods=False)
                      if _is_graph_step(f, grid.max_graph_bs) and f["continues_batch"]], dtype=float).reshape(-1, 3)
    sizes = sorted(grid.fit.get("graph_sizes") or grid.fit["graph_decode"]["batch_sizes"])
    out, below = [], 0
    for size in sizes:
        rows = steps[(steps[:, 0] > below) & (steps[:, 0] <= size)]
        below = size
        if len(rows) < MIN_BUCKET_STEPS or np.ptp(rows[:, 1]) == 0:
            continue
        b, a = np.polyfit(rows[:, 1], rows[:, 2], 1)
        grid_s = grid._decode_a[size] + grid._decode_b[size] * rows[:, 1]
        out.append({"bucket": size, "count": len(rows), "real_a_ms": 1e3 * a, "real_b_ns": 1e9 * b,
                    "grid_a_ms": 1e3 * grid._decode_a[size], "grid_b_ns": 1e9 * grid._decode_b[size],
                    "real_ms": 1e3 * rows[:, 2].mean(), "grid_ms": 1e3 * grid_s.mean()})
    return out


def profile_option(parser: argparse.ArgumentParser, value: str | None) -> Path:
    """The profile --profile names (default: the shipped qwen3-0.6b h200 one); exit 2 with one line for an empty
    --profile (it fell back to the shipped profile unsaid) or a missing shipped one. Reading it is the caller's:
    a missing, empty or garbled profile (or a folder) was a traceback."""
    if value is not None and not value.strip():
        parser.exit(2, "error: --profile is empty; expected a profile JSON (python -m sim.profile)\n")
    path = Path(value) if value else find_profile("qwen3-0.6b", "h200")
    if path is None:
        parser.exit(2, "error: the shipped qwen3-0.6b h200 profile is missing; pass --profile\n")
    return path


def uncalibrated_grid(path: Path) -> ProfiledCostModel:
    """The profile's grid refitted without its serving calibration; ValueError naming the file otherwise."""
    profile = read_profile(path)  # its errors name the file
    try:
        return ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    except ValueError as exc:  # too few points to fit: the message names no file
        raise ValueError(f"--profile {path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="GPU replay folders")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the shipped h200 qwen3-0.6b one)")
    parser.add_argument("--batch-bin", type=int, default=None, metavar="SEQS",
                        help="also split each class by batch size, in bins of this many sequences")
    parser.add_argument("--context-bin", type=int, default=None, metavar="TOKENS",
                        help="also split each class by the mean decode context, in bins of this many tokens")
    parser.add_argument("--split-finishing", action="store_true",
                        help="split the same-batch decode steps by whether a row finished in the step (the GPU "
                             "runner launched no step ahead during it)")
    parser.add_argument("--bucket-fit", action="store_true",
                        help="instead fit the same-batch decode steps per CUDA-graph bucket as a + b x KV tokens")
    args = parser.parse_args(argv)
    # 0 split nothing, as if the option were left out, at exit 0
    if args.batch_bin is not None and args.batch_bin < 1:
        parser.exit(2, f"error: --batch-bin: expected a number of sequences >= 1, got {args.batch_bin}\n")
    if args.context_bin is not None and args.context_bin < 1:
        parser.exit(2, f"error: --context-bin: expected a number of tokens >= 1, got {args.context_bin}\n")
    splits = [option for option, given in (("--batch-bin", args.batch_bin is not None),
                                           ("--context-bin", args.context_bin is not None),
                                           ("--split-finishing", args.split_finishing)) if given]
    if args.bucket_fit and splits:  # they split the step table --bucket-fit prints none of: ignored at exit 0
        parser.exit(2, f"error: --bucket-fit prints its fits, not the step table {' and '.join(splits)} would "
                       "split; give one or the other\n")
    batch_bin, context_bin = args.batch_bin or 0, args.context_bin or 0  # 0: not split
    missing = [run for run in args.runs if not (Path(run) / "steps.parquet").is_file()]
    if missing:
        parser.exit(2, f"error: {missing[0]}: no steps.parquet; expected an engine.replay run folder\n")
    twice = repeated_input_problem(args.runs, "run folder")  # its steps were counted twice in the table
    if twice:
        parser.exit(2, f"error: {twice}\n")
    # A sim.replay folder's steps are its cost model's own: every ratio read 1.000 at exit 0.
    not_gpu = next(filter(None, (gpu_run_problem(Path(run)) for run in args.runs)), None)
    if not_gpu:
        parser.exit(2, f"error: {not_gpu}\n")
    profile_path = profile_option(parser, args.profile)
    if args.bucket_fit:
        try:
            grid = uncalibrated_grid(profile_path)
            fits = bucket_fits([Path(run) for run in args.runs], grid)
        except ValueError as exc:
            parser.exit(2, f"error: {exc}\n")
        print(f"{'bucket':>6}{'steps':>8}{'real a ms':>11}{'grid a ms':>11}{'real b ns':>11}{'grid b ns':>11}"
              f"{'real ms':>9}{'grid ms':>9}")
        for r in fits:
            print(f"{r['bucket']:>6}{r['count']:>8}{r['real_a_ms']:>11.3f}{r['grid_a_ms']:>11.3f}{r['real_b_ns']:>11.1f}"
                  f"{r['grid_b_ns']:>11.1f}{r['real_ms']:>9.3f}{r['grid_ms']:>9.3f}")
        return 0
    try:
        models: dict[str, ProfiledCostModel] = {}  # one per sampling mode the runs took
        rows = []
        for run in args.runs:
            sampling = run_sampling(Path(run))
            if sampling not in models:  # "cost model PATH: not a readable profile (...)"
                models[sampling] = ProfiledCostModel.load(profile_path, sampling=sampling)
            rows.extend(step_errors(Path(run), models[sampling], batch_bin, context_bin, args.split_finishing))
    except ValueError as exc:  # read_steps names the file and what it expected
        parser.exit(2, f"error: {exc}\n")
    width = (36 if args.split_finishing else 20) + (16 if batch_bin else 0) + (28 if context_bin else 0)
    name_width = max([16, *(len(r["run"]) + 2 for r in rows)])  # max(16) of runs without a step was a TypeError
    print(f"{'run':<{name_width}}{'steps':<{width}}{'count':>7}{'real ms':>10}{'pred ms':>10}{'pred/real':>11}")
    for r in rows:
        print(f"{r['run']:<{name_width}}{r['steps']:<{width}}{r['count']:>7}{r['real_ms']:>10.2f}{r['predicted_ms']:>10.2f}"
              f"{r['predicted_over_real']:>11.3f}")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
