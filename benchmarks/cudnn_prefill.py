"""cuDNN's fused attention for prefill chunks, as an alternative to our paged Triton kernel:
``python benchmarks/cudnn_prefill.py --json out.json`` (needs a CUDA GPU).

On the qwen3-0.6b attention shape (16 query heads, 8 KV heads, head dim 128, bf16, causal, no cached prefix),
through ``torch.nn.functional.scaled_dot_product_attention`` restricted to the cuDNN backend:
- the first and the second call for chunk lengths not seen before (cuDNN builds an execution plan per shape);
- kernel time only (torch profiler, CUDA kernels summed, launch gaps excluded) and TFLOP/s for chunks taken one
  call each and for equal chunks batched into one call;
- whether a call can be captured in a CUDA graph.
``benchmarks/kernels.py --sections prefill`` times the same chunks end to end beside the Triton kernel.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

HQ, HKV, D = 16, 8, 128
NEW_LENGTHS = (1000, 1001, 1537, 2048, 3000, 4095, 4096, 6000, 8192, 777)
CASES = ((2048, 4), (4096, 2), (8192, 1), (1024, 8), (512, 16))  # (chunk length, chunks)


def qkv(torch, length: int, batch: int = 1):
    """Views of one fused QKV projection, as the engine's layers have them: [batch, heads, length, dim]."""
    fused = torch.randn(batch * length, (HQ + 2 * HKV) * D, device="cuda", dtype=torch.bfloat16)
    q = fused[:, :HQ * D].view(batch, length, HQ, D).transpose(1, 2)
    k = fused[:, HQ * D:(HQ + HKV) * D].view(batch, length, HKV, D).transpose(1, 2)
    v = fused[:, (HQ + HKV) * D:].view(batch, length, HKV, D).transpose(1, 2)
    return q, k, v


def attend(torch, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def kernel_ms(torch, fn, repeats: int = 20) -> float:
    """Mean CUDA kernel time of one ``fn()`` (its kernels summed, so launch gaps do not count)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return total_us / repeats / 1e3


def causal_tflop(length: int, chunks: int) -> float:
    return chunks * 4 * HQ * D * length * (length + 1) / 2 / 1e12


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/cudnn_prefill.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    problem = args.json is not None and check_output_path(args.json, "--json", [])  # before any GPU work
    if problem:
        parser.exit(2, f"error: {problem}\n")
    import torch

    if not torch.cuda.is_available():
        parser.exit(2, "error: this benchmark times CUDA kernels; it needs a CUDA GPU\n")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version(), "first_calls": [], "kernels": []}
    for length in NEW_LENGTHS:
        q, k, v = qkv(torch, length)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            started = time.perf_counter()
            attend(torch, q, k, v)
            torch.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - started))
        results["first_calls"].append({"length": length, "first_ms": times[0], "second_ms": times[1]})
        print(f"length {length}: first call {times[0]:.1f} ms, second {times[1]:.3f} ms", flush=True)
    for length, chunks in CASES:
        parts = [qkv(torch, length) for _ in range(chunks)]
        one_each = kernel_ms(torch, lambda parts=parts: [attend(torch, *p) for p in parts])
        batched_inputs = qkv(torch, length, chunks)
        batched = kernel_ms(torch, lambda inputs=batched_inputs: attend(torch, *inputs))
        tflop = causal_tflop(length, chunks)
        row = {"case": f"{chunks}x{length}", "one_call_each_ms": one_each,
               "one_call_each_tflop_per_s": tflop / one_each * 1e3, "batched_ms": batched,
               "batched_tflop_per_s": tflop / batched * 1e3}
        results["kernels"].append(row)
        print(f"{row['case']:8s} one call each {one_each:.3f} ms {row['one_call_each_tflop_per_s']:.0f} TFLOP/s; "
              f"batched {batched:.3f} ms {row['batched_tflop_per_s']:.0f} TFLOP/s", flush=True)
    try:
        q, k, v = qkv(torch, 2048)
        attend(torch, q, k, v)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            attend(torch, q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        results["graph_capture"] = "ok"
    except Exception as exc:  # report, do not fail the benchmark
        results["graph_capture"] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    print(f"CUDA graph capture: {results['graph_capture']}")
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
