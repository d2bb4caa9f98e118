"""Mixed steps, timed eager and through piecewise CUDA graphs: ``python benchmarks/step.py [--model qwen3-0.6b]``.

The step of issue 16: 8,192 batched tokens, four ~2k-token prefill chunks plus 80 decode rows
(contexts 512-2,047), dummy weights; a second case gives each chunk a 2,048-token cached prefix (the
paged attention path), a third is a small mixed step (one 1,968-token chunk and 80 decode rows), where
launches weigh most; a fourth is the full step of the prefill-heavy trace at capacity (112 decode rows of
contexts 1,900-2,200). Each case runs three ways on one engine: eagerly (every kernel launched from
Python), as piecewise CUDA graphs (``engine/gpu/piecewise_graphs.py``) with attention in sequence, and as
piecewise graphs with decode attention on a side stream beside prefill attention (``overlap``, the
engine option ``overlap_decode_attention``; ``engine/gpu/triton_launch.py``). Reports per case and mode
the median over repeats of: host launch time of the forward (no wait), the forward's GPU time (CUDA
events around it), the forward's wall time until the GPU is done, the whole step through
``ModelRunner.execute`` (logits and sampling too), and from one profiled step the kernels' summed GPU
time over that step's wall time (``gpu_busy``; above 1 where kernels overlap). Also the engine's start-up
(graph capture) time and the piecewise graphs' memory pool. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

NUM_DECODE = 80
DECODE_CONTEXTS = (512, 2048)
STEP_TOKENS = 8192
MODES = ("eager", "piecewise", "overlap")
CASES = {  # name: (batched tokens, prefill chunks, cached prefix per chunk, decode rows, their context range)
    "no-prefix": (STEP_TOKENS, 4, 0, NUM_DECODE, DECODE_CONTEXTS),
    "prefix-2048": (STEP_TOKENS, 4, 2048, NUM_DECODE, DECODE_CONTEXTS),
    "small-2048": (2048, 1, 0, NUM_DECODE, DECODE_CONTEXTS),
    # The prefill-heavy trace (prompts ~2,048, outputs ~28) near its capacity: ~110 rows decoding long contexts.
    "capacity": (STEP_TOKENS, 4, 0, 112, (1900, 2200)),
}


def mixed_plan(runner, step_tokens: int, num_chunks: int, prefix: int, num_decode: int = NUM_DECODE,
               decode_contexts: tuple[int, int] = DECODE_CONTEXTS, seed: int = 0):
    from engine.gpu.model_runner import StepPlan

    rng = np.random.default_rng(seed)
    page = runner.block_size
    chunk = (step_tokens - num_decode) // num_chunks
    decode_ctx = rng.integers(*decode_contexts, num_decode)
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
    prefill_tables = np.stack([table(prefix + chunk) for _ in range(num_chunks)])
    if next_block > runner.num_gpu_blocks:
        raise SystemExit(f"the step needs {next_block} KV blocks, the runner has {runner.num_gpu_blocks}")
    positions = [decode_ctx - 1] + [np.arange(prefix, prefix + chunk)] * num_chunks
    slots = [decode_tables[np.arange(num_decode), (decode_ctx - 1) // page] * page + (decode_ctx - 1) % page]
    for j in range(num_chunks):
        pos = positions[1 + j]
        slots.append(prefill_tables[j][pos // page].astype(np.int64) * page + pos % page)
    num_tokens = num_decode + num_chunks * chunk
    logits = list(range(num_decode)) + [num_decode + (j + 1) * chunk - 1 for j in range(num_chunks)]
    return StepPlan(
        ids=rng.integers(0, 10000, num_tokens).tolist(),
        positions=np.concatenate(positions).astype(np.int64),
        slots=np.concatenate(slots).astype(np.int64),
        num_decode=num_decode,
        decode_tables=decode_tables,
        logits_indices=logits,
        sample_rows=list(range(num_decode + num_chunks)),
        q_lens=[chunk] * num_chunks,
        context_lens=[prefix] * num_chunks,
        prefill_tables=prefill_tables,
    )


def forward(runner, inputs):
    """The forward alone, as ``ModelRunner.execute`` runs it for these inputs."""
    if inputs.piecewise_size:
        return runner.piecewise.run(inputs.piecewise_size, inputs.input_ids.shape[0], inputs.meta)
    return runner.model(inputs.input_ids, inputs.positions, inputs.meta)


def kernel_ms(torch, fn) -> tuple[float, dict[str, float]]:
    """Summed GPU time of the kernels ``fn`` launches (one profiled call; one stream, so no overlap), and the
    eight kernels that took longest, in ms."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    top = {e.key[:80]: round(e.self_device_time_total / 1e3, 3) for e in events[:8]}
    return sum(e.self_device_time_total for e in events) / 1e3, top


def time_case(torch, runner, plan, repeats: int) -> dict:
    from engine.gpu.layers.sampler import MASK32, SamplingTensors

    n = len(plan.sample_rows)
    sampling = SamplingTensors([0.6] * n, [-1] * n, [1.0] * n, [(7, row, MASK32) for row in range(n)], runner.device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {"prepare_ms": [], "launch_ms": [], "forward_gpu_ms": [], "forward_wall_ms": [], "step_wall_ms": []}
    with torch.inference_mode():
        for i in range(repeats + 3):  # three warm-ups: compilation and allocator growth stay out
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            inputs = runner.materialize(plan)
            t1 = time.perf_counter()
            start.record()
            forward(runner, inputs)
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
        row = {k: statistics.median(v) for k, v in samples.items()}
        inputs = runner.materialize(plan)
        row["kernel_ms"], row["top_kernels_ms"] = kernel_ms(torch, lambda: runner.execute(inputs, sampling))
    row["gpu_busy"] = row["kernel_ms"] / row["step_wall_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/step.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="shipped config name or model dir (dummy weights)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    problem = args.json is not None and check_output_path(args.json, "--json", [])  # before any GPU work
    if problem:
        parser.exit(2, f"error: {problem}\n")
    if args.repeats < 1:
        parser.exit(2, f"error: --repeats must be >= 1, got {args.repeats}\n")
    import torch

    if not torch.cuda.is_available():  # torch's AssertionError or triton's ModuleNotFoundError traceback otherwise
        parser.exit(2, "error: this benchmark times CUDA kernels; it needs a CUDA GPU (and triton)\n")

    from engine import LLM

    t0 = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", max_model_len=8192, max_num_batched_tokens=STEP_TOKENS,
              gpu_memory_utilization=0.5)
    runner = llm.runner
    results = {"model": args.model, "device": torch.cuda.get_device_name(), "num_decode": NUM_DECODE,
               "engine_start_s": time.perf_counter() - t0,
               "piecewise_buckets": runner.piecewise.sizes,
               "piecewise_graphs": sum(len(g) for g in runner.piecewise.graphs.values()),
               "piecewise_pool_bytes": runner.piecewise.pool_bytes,
               "graph_pool_reserved_bytes": runner.graph_pool_reserved_bytes,
               "targets": {"step_wall_ms": 18.0, "launch_ms": 2.0, "gpu_busy": 0.9}, "cases": {}}
    for name, (step_tokens, num_chunks, prefix, num_decode, contexts) in CASES.items():
        plan = mixed_plan(runner, step_tokens, num_chunks, prefix, num_decode, contexts)
        for mode in MODES:
            plan.piecewise_size = runner.piecewise.bucket(len(plan.ids)) if mode != "eager" else 0
            runner.backend.overlap_decode = mode == "overlap"
            row = time_case(torch, runner, plan, args.repeats)
            row.update(step_tokens=len(plan.ids), num_chunks=num_chunks, prefix=prefix, num_decode=num_decode,
                       decode_contexts=list(contexts))
            results["cases"][f"{name}/{mode}"] = row
            figures = ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k.endswith(("_ms", "busy"))
                                and not isinstance(v, dict))
            print(f"{args.model} {name:12s} {mode:9s} {figures}", flush=True)
            print("    top kernels (ms): " + "; ".join(f"{k} {v}" for k, v in row["top_kernels_ms"].items()))
    llm.close()
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
