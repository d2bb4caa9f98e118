"""One eager mixed step, timed: ``python benchmarks/step.py [--model qwen3-0.6b] [--json out.json]``.

The step of issue 16: 8,192 batched tokens, four ~2k-token prefill chunks plus 80 decode rows
(contexts 512-2,047), dummy weights, run eagerly (no CUDA graph applies to it). Reports per case the
median over repeats of: host launch time of the forward (Python issuing kernels, no wait), the
forward's GPU time (CUDA events around it), the wall time of the forward until the GPU is done, and
the whole step through ``ModelRunner.execute`` (logits and sampling too). A second case gives each
chunk a 2,048-token cached prefix (the paged attention path). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NUM_DECODE = 80
NUM_CHUNKS = 4
STEP_TOKENS = 8192


def mixed_plan(runner, prefix: int, seed: int = 0):
    from engine.gpu.model_runner import StepPlan

    rng = np.random.default_rng(seed)
    page = runner.block_size
    chunk = (STEP_TOKENS - NUM_DECODE) // NUM_CHUNKS
    decode_ctx = rng.integers(512, 2048, NUM_DECODE)
    width = runner.max_blocks_per_seq
    next_block = 0

    def table(length):
        nonlocal next_block
        n = -(-length // page)
        row = np.zeros(width, dtype=np.int32)
        row[:n] = np.arange(next_block, next_block + n)
        next_block += n
        return row

    decode_tables = np.stack([table(int(c)) for c in decode_ctx])
    prefill_tables = np.stack([table(prefix + chunk) for _ in range(NUM_CHUNKS)])
    if next_block > runner.num_gpu_blocks:
        raise SystemExit(f"the step needs {next_block} KV blocks, the runner has {runner.num_gpu_blocks}")
    positions = [decode_ctx - 1] + [np.arange(prefix, prefix + chunk)] * NUM_CHUNKS
    slots = [decode_tables[np.arange(NUM_DECODE), (decode_ctx - 1) // page] * page + (decode_ctx - 1) % page]
    for j in range(NUM_CHUNKS):
        pos = positions[1 + j]
        slots.append(prefill_tables[j][pos // page].astype(np.int64) * page + pos % page)
    num_tokens = NUM_DECODE + NUM_CHUNKS * chunk
    logits = list(range(NUM_DECODE)) + [NUM_DECODE + (j + 1) * chunk - 1 for j in range(NUM_CHUNKS)]
    return StepPlan(
        ids=rng.integers(0, 10000, num_tokens).tolist(),
        positions=np.concatenate(positions).astype(np.int64),
        slots=np.concatenate(slots).astype(np.int64),
        num_decode=NUM_DECODE,
        decode_tables=decode_tables,
        logits_indices=logits,
        sample_rows=list(range(NUM_DECODE + NUM_CHUNKS)),
        q_lens=[chunk] * NUM_CHUNKS,
        context_lens=[prefix] * NUM_CHUNKS,
        prefill_tables=prefill_tables,
    )


def time_case(torch, runner, plan, repeats: int) -> dict:
    from engine.gpu.layers.sampler import SamplingTensors

    n = len(plan.sample_rows)
    sampling = SamplingTensors([0.6] * n, [-1] * n, [1.0] * n, [None] * n, runner.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {"prepare_ms": [], "launch_ms": [], "forward_gpu_ms": [], "forward_wall_ms": [], "step_wall_ms": []}
    with torch.inference_mode():
        for i in range(repeats + 3):  # three warm-ups: compilation and allocator growth stay out
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            inputs = runner.materialize(plan)
            t1 = time.perf_counter()
            start.record()
            runner.model(inputs.input_ids, inputs.positions, inputs.meta)
            t2 = time.perf_counter()
            end.record()
            end.synchronize()
            t3 = time.perf_counter()
            runner.execute(inputs, sampling)
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            if i >= 3:
                samples["prepare_ms"].append(1e3 * (t1 - t0))
                samples["launch_ms"].append(1e3 * (t2 - t1))
                samples["forward_gpu_ms"].append(start.elapsed_time(end))
                samples["forward_wall_ms"].append(1e3 * (t3 - t1))
                samples["step_wall_ms"].append(1e3 * (t4 - t3))
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/step.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="shipped config name or model dir (dummy weights)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    import torch

    from engine import LLM

    llm = LLM(args.model, load_format="dummy", enforce_eager=True, max_model_len=8192,
              max_num_batched_tokens=STEP_TOKENS, gpu_memory_utilization=0.5)
    runner = llm.runner
    results = {"model": args.model, "device": torch.cuda.get_device_name(), "step_tokens": STEP_TOKENS,
               "num_decode": NUM_DECODE, "num_chunks": NUM_CHUNKS, "cases": {}}
    for name, prefix in (("no-prefix", 0), ("prefix-2048", 2048)):
        row = time_case(torch, runner, mixed_plan(runner, prefix), args.repeats)
        results["cases"][name] = row
        print(f"{args.model} {name:12s} " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    llm.close()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
