"""Real decode batches (context vectors rebuilt from GPU runs) through one layer's paged decode, as the engine runs it
(its long-context slots) and with more slots, against an equal-context batch of the same KV tokens (what the profile
grid's points measure).

    python benchmarks/decode_real_batches.py OUT.json [CONTEXTS.json]

On the GPU. CONTEXTS.json (default: validation/results/machine-f-2026-12-03/probe/contexts.json, written by
``dump_contexts.py`` beside it from the GPU runs' request tables) holds each batch's contexts.
"""

import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import read_json_input  # noqa: E402

DEFAULT_CONTEXTS = Path(__file__).resolve().parents[1] / "validation/results/machine-f-2026-12-03/probe/contexts.json"
DEV = "cuda"
HEADS, KV_HEADS, DIM, PAGE, MAX_LEN = 16, 8, 128, 256, 16384  # qwen3-0.6b, the runs' page size and max_model_len


def run(lengths: list[int], bucket: int, slots: int | None, sms: int) -> tuple[float, object]:
    """One layer's decode over contexts ``lengths``, planned as for CUDA-graph ``bucket`` (with ``slots`` long-context
    slots instead of the engine's, if given): microseconds per launch, and the DecodeSplits used."""
    import torch

    from benchmarks.decode_splits import graph_time_us, paged_decode_inputs
    from engine.gpu.attention.triton_kernels import paged_decode
    from engine.gpu.attention.triton_kernels_host import (
        DecodeSplits,
        decode_row_order,
        decode_splits,
        long_decode_rows,
    )

    q, k, v, tables, context, out = paged_decode_inputs(lengths, HEADS, KV_HEADS, DIM, PAGE, DEV)
    plan = decode_splits(bucket, KV_HEADS, MAX_LEN, sms)  # the engine plans from the CUDA-graph bucket
    if slots is not None and plan.num_long_seqs:
        plan = DecodeSplits(plan.num_splits, plan.fill_splits, plan.cap_tiles, slots)
    rows = long_decode_rows(lengths, plan)
    longs = torch.tensor(rows, dtype=torch.int32, device=DEV) if rows else None
    order = torch.tensor(decode_row_order(lengths), dtype=torch.int32, device=DEV)
    return graph_time_us(functools.partial(paged_decode, q, k, v, tables, context, DIM**-0.5, plan.num_splits, out=out,
                                     fill_splits=plan.fill_splits, long_seqs=longs, row_order=order)), plan


BUCKETS = (48, 64, 80, 96, 112, 128)  # the engine's CUDA-graph decode batch sizes a batch of these runs is planned for


def read_cases(path: Path) -> list[dict]:
    """CONTEXTS.json's batches; ValueError naming the file (and the batch) unless each has a run, a step, its real
    time and 1 to BUCKETS[-1] contexts of 1 to MAX_LEN tokens (a damaged file was a traceback only after CUDA
    started, a batch past the largest bucket a StopIteration after the batches before it were timed)."""
    try:
        cases = json.loads(read_json_input(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{path}: expected a non-empty JSON array of batches (dump_contexts.py's contexts.json)")
    for i, case in enumerate(cases):
        ctx = case.get("contexts") if isinstance(case, dict) else None
        if (not isinstance(ctx, list) or not 1 <= len(ctx) <= BUCKETS[-1]
                or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_LEN for c in ctx)
                or not isinstance(case.get("real_ms"), (int, float)) or "run" not in case or "step" not in case):
            raise ValueError(f"{path}: batch [{i}]: expected run, step, real_ms (a number) and contexts: 1 to "
                             f"{BUCKETS[-1]} integers from 1 to {MAX_LEN}")
    return cases


def main(argv: list[str] | None = None) -> None:
    parser = OneLineErrorParser(prog="python benchmarks/decode_real_batches.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", metavar="OUT.json", help="write the results here")
    parser.add_argument("contexts", metavar="CONTEXTS.json", nargs="?", default=str(DEFAULT_CONTEXTS),
                        help="each batch's contexts (default: the machine-f probe's contexts.json)")
    args = parser.parse_args(argv)
    from sim.files import check_output_path, write_text_atomic

    # Before CUDA is asked for: OUT.json given as the contexts (or the default's path) replaced them after the run.
    problem = check_output_path(args.out, "OUT.json", [Path(args.contexts)])
    try:
        cases = read_cases(Path(args.contexts))
    except ValueError as exc:
        problem = problem or str(exc)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    import torch

    if not torch.cuda.is_available():  # a triton ModuleNotFoundError or torch AssertionError traceback otherwise
        print("error: this benchmark times CUDA kernels; it needs a CUDA GPU (and triton)", file=sys.stderr)
        sys.exit(2)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for case in cases:
        ctx = case["contexts"]
        bs = len(ctx)
        bucket = next(b for b in BUCKETS if b >= bs)
        row = {"run": case["run"], "step": case["step"], "bs": bs, "bucket": bucket, "kv": sum(ctx), "max": max(ctx),
               "num_over_2048": sum(c > 2048 for c in ctx), "real_step_ms": round(case["real_ms"], 2)}
        row["equal_us"], plan = run([sum(ctx) // bs] * bs, bucket, None, sms)
        row["fill_splits"], row["num_splits"] = plan.fill_splits, plan.num_splits
        for slots in (None, 8, 16, 32):
            us, used = run(ctx, bucket, slots, sms)
            row[f"slots_{used.num_long_seqs}_us"] = us
        print(json.dumps(row), flush=True)
        results.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.out), json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    one_line_script_errors(main)()
