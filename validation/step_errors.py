"""Where the cost model misses: the measured profile's prediction for every step of a GPU run.

    python validation/step_errors.py validation/runs/real/b-azure-p70 [...]

Steps are read as ``sim.calibrate`` reads them (``sim.batch_features.read_steps`` with periods): a step's real
time is its period where the engine went straight on to another step, and runs recorded before
``continues_batch`` get it rebuilt. Steps are split into eager steps (any prefill), decode steps that do not
repeat the batch before them (after a prefill, a finish or a preemption: the engine plans them while they run),
and the remaining decode steps (planned during the step before). For each class it prints the real and
predicted mean durations and their ratio, so a latency error can be traced to a kind of step.
The profile's serving calibration applies (its averages), as in ``sim.replay``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.batch_features import read_steps  # noqa: E402
from sim.profiled_cost_model import ProfiledCostModel, find_profile  # noqa: E402

CLASSES = ("eager", "decode, new batch", "decode, same batch")


def _class(f: dict) -> str:
    if f["num_prefill_tokens"]:
        return CLASSES[0]
    return CLASSES[2] if f["continues_batch"] else CLASSES[1]


def _label(f: dict, batch_bin: int) -> str:
    """The step's class, and with ``batch_bin`` the range of its batch size (sequences) in bins that wide."""
    if not batch_bin:
        return _class(f)
    low = f["num_seqs"] // batch_bin * batch_bin
    return f"{_class(f)}, {low}-{low + batch_bin - 1} seqs"


def step_errors(run_dir: Path, model: ProfiledCostModel, batch_bin: int = 0) -> list[dict]:
    sums = {label: [0, 0.0, 0.0] for label in (*CLASSES, "all")} if not batch_bin else {}  # count, real s, pred s
    for f, real_s, _ in read_steps(run_dir, periods=True):
        predicted_s = model.predict(f)
        for label in (_label(f, batch_bin), "all"):
            part = sums.setdefault(label, [0, 0.0, 0.0])
            part[0] += 1
            part[1] += real_s
            part[2] += predicted_s
    if batch_bin:  # classes in order, then batch sizes ascending, the whole run last
        sums = dict(sorted(sums.items(), key=lambda kv: _order(kv[0])))
    return [{"run": run_dir.name, "steps": label, "count": count, "real_ms": 1e3 * real / count,
             "predicted_ms": 1e3 * pred / count, "predicted_over_real": pred / real}
            for label, (count, real, pred) in sums.items() if count]


def _order(label: str) -> tuple:
    if label == "all":
        return (len(CLASSES), 0)
    name, _, seqs = label.rpartition(", ")
    return (CLASSES.index(name), int(seqs.split("-")[0]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="GPU replay folders")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the shipped h200 qwen3-0.6b one)")
    parser.add_argument("--batch-bin", type=int, default=0, metavar="SEQS",
                        help="also split each class by batch size, in bins of this many sequences")
    args = parser.parse_args(argv)
    if args.batch_bin < 0:
        parser.exit(2, f"error: --batch-bin: expected a number of sequences >= 1, got {args.batch_bin}\n")
    missing = [run for run in args.runs if not (Path(run) / "steps.parquet").is_file()]
    if missing:
        parser.exit(2, f"error: {missing[0]}: no steps.parquet; expected an engine.replay run folder\n")
    model = ProfiledCostModel.load(Path(args.profile) if args.profile else find_profile("qwen3-0.6b", "h200"))
    try:
        rows = [r for run in args.runs for r in step_errors(Path(run), model, args.batch_bin)]
    except ValueError as exc:  # read_steps names the file and what it expected
        parser.exit(2, f"error: {exc}\n")
    width = 36 if args.batch_bin else 20
    name_width = max(16, *(len(r["run"]) + 2 for r in rows))
    print(f"{'run':<{name_width}}{'steps':<{width}}{'count':>7}{'real ms':>10}{'pred ms':>10}{'pred/real':>11}")
    for r in rows:
        print(f"{r['run']:<{name_width}}{r['steps']:<{width}}{r['count']:>7}{r['real_ms']:>10.2f}{r['predicted_ms']:>10.2f}"
              f"{r['predicted_over_real']:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
