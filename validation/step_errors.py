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


def _class(f: dict) -> int:
    """The step's index in CLASSES."""
    if f["num_prefill_tokens"]:
        return 0
    return 2 if f["continues_batch"] else 1


def _key(f: dict, batch_bin: int, context_bin: int) -> tuple[int, int, int]:
    """(class, lowest batch size of its bin, lowest mean decode context of its bin); -1 where not split."""
    seqs = f["num_seqs"] // batch_bin * batch_bin if batch_bin else -1
    mean_context = f["decode_context_tokens"] // f["num_decode_seqs"] if f["num_decode_seqs"] else 0
    return _class(f), seqs, (mean_context // context_bin * context_bin if context_bin else -1)


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


def step_errors(run_dir: Path, model: ProfiledCostModel, batch_bin: int = 0, context_bin: int = 0) -> list[dict]:
    """Per class (and bin) of the run's steps, then the whole run: count, mean real and predicted ms, their ratio."""
    whole = (len(CLASSES), -1, -1)
    sums: dict[tuple, list] = {}  # count, real s, predicted s
    for f, real_s, _ in read_steps(run_dir, periods=True):
        predicted_s = model.predict(f)
        for key in (_key(f, batch_bin, context_bin), whole):
            part = sums.setdefault(key, [0, 0.0, 0.0])
            part[0] += 1
            part[1] += real_s
            part[2] += predicted_s
    return [{"run": run_dir.name, "steps": _label(key, batch_bin, context_bin), "count": count,
             "real_ms": 1e3 * real / count, "predicted_ms": 1e3 * pred / count, "predicted_over_real": pred / real}
            for key, (count, real, pred) in sorted(sums.items())]  # classes in order, bins ascending, the run last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="GPU replay folders")
    parser.add_argument("--profile", default=None, help="profile JSON (default: the shipped h200 qwen3-0.6b one)")
    parser.add_argument("--batch-bin", type=int, default=0, metavar="SEQS",
                        help="also split each class by batch size, in bins of this many sequences")
    parser.add_argument("--context-bin", type=int, default=0, metavar="TOKENS",
                        help="also split each class by the mean decode context, in bins of this many tokens")
    args = parser.parse_args(argv)
    if args.batch_bin < 0:
        parser.exit(2, f"error: --batch-bin: expected a number of sequences >= 1, got {args.batch_bin}\n")
    if args.context_bin < 0:
        parser.exit(2, f"error: --context-bin: expected a number of tokens >= 1, got {args.context_bin}\n")
    missing = [run for run in args.runs if not (Path(run) / "steps.parquet").is_file()]
    if missing:
        parser.exit(2, f"error: {missing[0]}: no steps.parquet; expected an engine.replay run folder\n")
    model = ProfiledCostModel.load(Path(args.profile) if args.profile else find_profile("qwen3-0.6b", "h200"))
    try:
        rows = [r for run in args.runs for r in step_errors(Path(run), model, args.batch_bin, args.context_bin)]
    except ValueError as exc:  # read_steps names the file and what it expected
        parser.exit(2, f"error: {exc}\n")
    width = 20 + (16 if args.batch_bin else 0) + (28 if args.context_bin else 0)
    name_width = max(16, *(len(r["run"]) + 2 for r in rows))
    print(f"{'run':<{name_width}}{'steps':<{width}}{'count':>7}{'real ms':>10}{'pred ms':>10}{'pred/real':>11}")
    for r in rows:
        print(f"{r['run']:<{name_width}}{r['steps']:<{width}}{r['count']:>7}{r['real_ms']:>10.2f}{r['predicted_ms']:>10.2f}"
              f"{r['predicted_over_real']:>11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
