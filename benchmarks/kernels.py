"""Per-kernel speed against the GPU's measured ceilings: ``python benchmarks/kernels.py --json out.json``.

Measures, on the qwen3-0.6b attention shape (16 query heads, 8 KV heads, head dim 128, bf16):
- the two ceilings: HBM copy bandwidth (bytes read + written) and bf16 matmul rate (8192^3);
- causal prefill attention in TFLOP/s: our paged Triton kernel (a sweep of tile configs, and the
  baseline kernel of another checkout with --baseline-root), torch's FlashAttention-2 varlen on
  contiguous and on strided (fused-QKV) inputs; chunks with and without a cached prefix;
- the memory-bound fused kernels (q/k norm + rotary, RMSNorm, SiLU-and-mul, KV store) in TB/s;
- host time per launch: Triton's ``kernel[grid](...)`` against our ``BoundKernel``.
Times are medians of ``triton.testing.do_bench`` (CUDA events). Needs a CUDA GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

HQ, HKV, D, PAGE = 16, 8, 128, 256
PREFILL_CASES = [  # (chunk lengths, cached prefix per chunk)
    ([2048] * 4, 0),
    ([4096] * 2, 0),
    ([8192], 0),
    ([2048] * 4, 2048),
]
# (BLOCK_M tokens, BLOCK_N keys, num_warps, num_stages, query heads per program[, TMA loads]); the first is the
# engine's default for long chunks (PREFILL_CONFIG_LONG).
TRITON_CONFIGS = [(64, 64, 4, 3, 2, True), (64, 64, 4, 3, 2), (128, 128, 8, 3, 1), (128, 64, 4, 3, 1),
                  (64, 128, 8, 3, 2), (64, 64, 8, 3, 2), (128, 64, 8, 2, 2), (64, 64, 4, 4, 2, True),
                  (64, 128, 8, 3, 2, True), (128, 64, 8, 3, 2, True), (128, 128, 8, 3, 1, True),
                  (128, 64, 8, 3, 1, True), (64, 64, 4, 2, 2, True), (128, 128, 8, 2, 2, True),
                  (64, 128, 4, 3, 2, True)]
ROPE_CONFIGS = [(16, 4), (32, 4), (64, 4), (64, 8)]  # (rows per program, num_warps); the first is ours


def varlen_causal(torch, q, k, v, cu_seqlens, max_len: int, scale: float):
    """torch's built-in FlashAttention-2 (varlen) on chunks with no cached prefix; it takes no block table."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, True,
                                                   False, scale=scale)[0]


def bench_ms(fn) -> float:
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def ceilings(torch) -> dict:
    src = torch.randn(2 << 30 >> 1, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = min(bench_ms(lambda: a @ b) for _ in range(2))  # the first may run while the clocks ramp up
    return {"copy_tb_per_s": 2 * (2 << 30) / copy_ms / 1e9, "matmul_tflop_per_s": 2 * 8192**3 / mm_ms / 1e9}


def load_baseline(root: Path):
    path = root / "engine/gpu/attention/triton_kernels.py"
    modules = []
    for name, path in (("baseline_triton_kernels", root / "engine/gpu/attention/triton_kernels.py"),
                       ("baseline_fused_kernels", root / "engine/gpu/layers/fused_kernels.py")):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # Triton reads a kernel's module back by name
        spec.loader.exec_module(module)
        modules.append(module)
    return modules


def prefill_inputs(torch, q_lens, prefix, gen):
    totals = [prefix + n for n in q_lens]
    blocks = [-(-t // PAGE) for t in totals]
    num_blocks = sum(blocks)
    k_cache = torch.randn(num_blocks, HKV, PAGE, D, generator=gen, device="cuda").bfloat16()
    v_cache = torch.randn(num_blocks, HKV, PAGE, D, generator=gen, device="cuda").bfloat16()
    perm = torch.randperm(num_blocks, generator=gen, device="cuda").to(torch.int32)
    tables = torch.zeros(len(q_lens), max(blocks), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = perm[start : start + n]
        start += n
    tokens = sum(q_lens)
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, generator=gen, device="cuda").bfloat16()
    cu = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(q_lens, device="cuda").cumsum(0)
    ctx = torch.full((len(q_lens),), prefix, dtype=torch.int32, device="cuda")
    # The chunk's own K/V into the cache, so the paged kernel and flash see the same keys.
    q = qkv[:, : HQ * D].view(tokens, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(tokens, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(tokens, HKV, D)
    return q, k, v, k_cache, v_cache, tables, cu, ctx


def causal_flops(q_lens, prefix) -> float:
    return sum(4 * HQ * D * (n * prefix + n * (n + 1) / 2) for n in q_lens)


def bench_prefill(torch, kernels, baseline, gen, num_configs=None) -> list[dict]:
    rows = []
    for q_lens, prefix in PREFILL_CASES:
        rows += bench_prefill_case(torch, kernels, baseline, gen, q_lens, prefix, num_configs)
        torch.cuda.empty_cache()
    return rows


def bench_prefill_case(torch, kernels, baseline, gen, q_lens, prefix, num_configs=None) -> list[dict]:
    rows = []
    scale = D**-0.5
    q, k, v, k_cache, v_cache, tables, cu, ctx = prefill_inputs(torch, q_lens, prefix, gen)
    positions = torch.cat([torch.arange(prefix, prefix + n, device="cuda") for n in q_lens])
    slots = torch.cat([
        (tables[i, (positions[int(cu[i]) : int(cu[i + 1])] // PAGE)].long() * PAGE
         + positions[int(cu[i]) : int(cu[i + 1])] % PAGE) for i in range(len(q_lens))])
    kernels.store_kv(k, v, k_cache, v_cache, slots)
    flops = causal_flops(q_lens, prefix)
    case = f"{len(q_lens)}x{q_lens[0]}" + (f"+prefix{prefix}" if prefix else "")
    max_q = max(q_lens)
    ref = kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, max_q, scale, config=TRITON_CONFIGS[0])

    def record(name, fn, out=None):
        try:
            ms = bench_ms(fn)
        except Exception as exc:  # a tile config that does not compile: say so, go on
            rows.append({"case": case, "kernel": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
            print(f"prefill {case:18s} {name:36s} failed: {type(exc).__name__}", flush=True)
            return
        row = {"case": case, "kernel": name, "ms": ms, "tflop_per_s": flops / ms / 1e9}
        if out is not None:
            row["rel_err_vs_triton"] = rel_err(out, ref)
        rows.append(row)
        print(f"prefill {case:18s} {name:36s} {ms:8.3f} ms {row['tflop_per_s']:7.1f} TFLOP/s "
              f"err {row.get('rel_err_vs_triton', 0):.1e}", flush=True)

    def paged(module, config=None):
        out = torch.empty_like(q)
        kwargs = {"config": config} if config else {}
        return lambda: module.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, max_q, scale, out=out, **kwargs)

    for config in TRITON_CONFIGS[:num_configs]:
        fn = paged(kernels, config)
        try:
            out = fn()
        except Exception:
            out = None
        record(f"triton paged {config}", fn, out)
    if baseline is not None:
        fn = paged(baseline)
        record("triton paged (baseline checkout)", fn, fn())
    if prefix == 0:
        record("torch flash varlen, fused-QKV views", lambda: varlen_causal(torch, q, k, v, cu, max_q, scale),
               varlen_causal(torch, q, k, v, cu, max_q, scale))
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        record("torch flash varlen, contiguous", lambda: varlen_causal(torch, qc, kc, vc, cu, max_q, scale),
               varlen_causal(torch, qc, kc, vc, cu, max_q, scale))
        # cuDNN's fused attention (Hopper kernels of its own): ragged over the chunks in one call, and through
        # SDPA one chunk at a time; with the KV heads as they are (GQA) and repeated to the query heads.
        def ragged():  # (GQA heads only: it takes some 70 ms a call on the H200 with torch 2.11)
            return cudnn_ragged_causal(torch, qc, kc, vc, cu, max_q, scale)

        try:
            first = ragged()
        except Exception:
            first = None
        record("cudnn ragged", ragged, first)
        bounds = [(int(cu[i]), int(cu[i + 1])) for i in range(len(q_lens))]
        for expand in (False, True):
            tag = ", KV heads repeated" if expand else ""
            for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
                def per_chunk(backend=backend, expand=expand):
                    return sdpa_per_chunk(torch, q, k, v, bounds, scale, backend, expand)

                try:
                    first = per_chunk()
                except Exception as exc:
                    print(f"prefill {case:18s} sdpa {backend.lower()}: {type(exc).__name__}: {str(exc)[:300]}")
                    first = None
                record(f"sdpa {backend.lower()} per chunk{tag}", per_chunk, first)
    return rows


def cudnn_ragged_causal(torch, q, k, v, cu_seqlens, max_len: int, scale: float):
    """cuDNN's attention over chunks packed back to back ([tokens, heads, head dim], cumulative lengths)."""
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu_seqlens, cu_seqlens, max_len, max_len, False,
                                                   0.0, True, False, scale=scale)[0]


def sdpa_per_chunk(torch, q, k, v, bounds, scale: float, backend: str, expand: bool):
    """torch's scaled_dot_product_attention on one chunk at a time, through ``backend`` only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = torch.empty_like(q)
    with sdpa_kernel(getattr(SDPBackend, backend)):
        for start, end in bounds:
            qi, ki, vi = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
            if expand:
                ki, vi = ki.repeat_interleave(HQ // HKV, 1), vi.repeat_interleave(HQ // HKV, 1)
            o = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale,
                                                                 enable_gqa=not expand)
            out[start:end] = o.squeeze(0).transpose(0, 1)
    return out


SPLIT_CASES = [([64], 16384), ([256], 16384), ([1024], 16384), ([256] * 4, 8192), ([2048], 4096)]


def bench_prefill_splits(torch, kernels, gen) -> list[dict]:
    """Short chunks over long cached prefixes (a new turn of a conversation): one program per query tile
    reading the whole prefix (num_splits 1) against the key ranges the heuristic picks. Reports the time,
    the KV bytes read per second and the causal TFLOP/s."""
    rows = []
    scale = D**-0.5
    for q_lens, prefix in SPLIT_CASES:
        q, k, v, k_cache, v_cache, tables, cu, ctx = prefill_inputs(torch, q_lens, prefix, gen)
        max_q, max_k = max(q_lens), prefix + max(q_lens)
        kv_bytes = sum(2 * (prefix + n) * HKV * D * 2 for n in q_lens)
        case = f"{len(q_lens)}x{q_lens[0]}+prefix{prefix}"
        ref = kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, max_q, scale, num_splits=1)
        for splits in (1, None):
            out = torch.empty_like(q)
            fn = functools.partial(kernels.paged_prefill, q, k_cache, v_cache, tables, cu, ctx, max_q, scale,
                                   out=out, num_splits=splits, max_k_len=max_k)
            fn()
            ms = bench_ms(fn)
            row = {"case": case, "num_splits": splits or "auto", "ms": ms, "kv_tb_per_s": kv_bytes / ms / 1e9,
                   "tflop_per_s": causal_flops(q_lens, prefix) / ms / 1e9, "rel_err_vs_unsplit": rel_err(out, ref)}
            rows.append(row)
            print(f"prefill split {case:22s} splits {str(row['num_splits']):4s} {ms:8.3f} ms "
                  f"{row['kv_tb_per_s']:6.2f} TB/s {row['tflop_per_s']:7.1f} TFLOP/s "
                  f"err {row['rel_err_vs_unsplit']:.1e}", flush=True)
        torch.cuda.empty_cache()
    return rows


def flash_impls(torch) -> str:
    """Which FlashAttention implementations this torch can switch SDPA to (FA3 and later come as add-ons)."""
    try:
        from torch.nn.attention import current_flash_attention_impl, list_flash_attention_impls

        return f"{list_flash_attention_impls()} (current {current_flash_attention_impl()})"
    except Exception as exc:  # an older torch
        return f"unknown ({type(exc).__name__})"


def probe_flash_block_table(torch) -> str:
    """Whether this torch's flash forward takes a block table (paged KV): it would serve cached prefixes too."""
    q = torch.randn(4, HQ, D, device="cuda").bfloat16()
    k = torch.randn(2, PAGE, HKV, D, device="cuda").bfloat16()
    cu = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    table = torch.tensor([[0, 1]], dtype=torch.int32, device="cuda")
    try:
        torch.ops.aten._flash_attention_forward(q, k, k, cu, cu, 4, 300, 0.0, True, False,
                                                seqused_k=torch.tensor([300], dtype=torch.int32, device="cuda"),
                                                block_table=table)
    except Exception as exc:  # report what this build says, whatever it raises
        return f"no: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return "yes"


def bench_fused(torch, baseline_fused, gen) -> list[dict]:
    from engine.gpu.attention import triton_kernels as kernels
    from engine.gpu.layers import fused_kernels as fused
    from engine.gpu.layers.rotary_embedding import RotaryEmbedding

    rows = []
    tokens = 8192
    width = (HQ + 2 * HKV) * D
    qkv = torch.randn(tokens, width, generator=gen, device="cuda").bfloat16()
    positions = torch.randint(0, 4096, (tokens,), generator=gen, device="cuda")
    cos_sin = RotaryEmbedding(D, 40960, 1e6).cuda().cos_sin_cache
    qw = torch.rand(D, generator=gen, device="cuda").bfloat16() + 0.5
    kw = torch.rand(D, generator=gen, device="cuda").bfloat16() + 0.5
    rope_bytes = 2 * tokens * (HQ + HKV) * D * 2

    def record(name, fn, num_bytes, extra=None):
        ms = bench_ms(fn)
        row = {"kernel": name, "tokens": tokens, "ms": ms, "bytes": num_bytes, "tb_per_s": num_bytes / ms / 1e9,
               **(extra or {})}
        rows.append(row)
        print(f"{name:40s} {ms * 1e3:9.1f} us {row['tb_per_s']:6.2f} TB/s", flush=True)

    def rope(module):
        return lambda: module.qk_norm_rope_(qkv, positions, cos_sin, HQ, HKV, D, qw, kw, 1e-6)

    check = qkv.clone()
    fused.qk_norm_rope_(check, positions, cos_sin, HQ, HKV, D, qw, kw, 1e-6)
    extra = {}
    if baseline_fused is not None:
        old = qkv.clone()
        baseline_fused.qk_norm_rope_(old, positions, cos_sin, HQ, HKV, D, qw, kw, 1e-6)
        extra = {"max_abs_diff_vs_baseline": float((check.float() - old.float()).abs().max())}
        record("qk_norm_rope (baseline checkout)", rope(baseline_fused), rope_bytes)
    record("qk_norm_rope", rope(fused), rope_bytes, extra)
    num_rows = tokens * (HQ + HKV)
    for block_rows, warps in ROPE_CONFIGS[1:]:
        record(f"qk_norm_rope rows {block_rows} warps {warps}", lambda b=block_rows, w=warps: fused._qk_norm_rope(
            (-(-num_rows // b),), (qkv, positions, cos_sin, qw, kw, qkv.stride(0), cos_sin.stride(0), num_rows, 1e-6),
            dict(NUM_Q_HEADS=HQ, NUM_HEADS=HQ + HKV, HEAD_DIM=D, HAS_NORM=True, BLOCK_ROWS=b), num_warps=w),
            rope_bytes)
    hidden = torch.randn(tokens, 1024, generator=gen, device="cuda").bfloat16()
    residual = torch.randn_like(hidden)
    weight = torch.rand(1024, generator=gen, device="cuda").bfloat16()
    record("rms_norm + residual", lambda: fused.rms_norm(hidden, weight, 1e-6, residual), 4 * tokens * 1024 * 2)
    gate_up = torch.randn(tokens, 2 * 3072, generator=gen, device="cuda").bfloat16()
    record("silu_and_mul", lambda: fused.silu_and_mul(gate_up), 3 * tokens * 3072 * 2)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(tokens, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(tokens, HKV, D)
    k_cache = torch.empty(tokens // PAGE + 1, HKV, PAGE, D, device="cuda").bfloat16()
    v_cache = torch.empty_like(k_cache)
    slots = torch.randperm(tokens, generator=gen, device="cuda")
    record("store_kv", lambda: kernels.store_kv(k, v, k_cache, v_cache, slots), 2 * 2 * tokens * HKV * D * 2)
    return rows


def bench_launch(torch) -> list[dict]:
    """Host microseconds per launch of a one-row RMSNorm: Triton's JIT path against the bound launcher."""
    import triton

    from engine.gpu.layers import fused_kernels as fused

    x = torch.randn(1, 1024, device="cuda").bfloat16()
    w = torch.rand(1024, device="cuda").bfloat16()
    out = torch.empty_like(x)
    args = (x, x, w, out, x.stride(0), 0, out.stride(0), 1024, 1e-6)
    consts = dict(HAS_RESIDUAL=False, BLOCK=1024)
    n = 2000

    def jit_launch():
        fused._rms_norm_kernel[(1,)](*args, **consts, num_warps=4)

    def bound_launch():
        fused._rms_norm((1,), args, consts, num_warps=4)

    def full_call():
        fused.rms_norm(x, w, 1e-6)

    bound_launch()
    compiled = next(iter(fused._rms_norm._compiled.values()))
    stream = torch.cuda.current_stream().cuda_stream

    def run_only():  # the floor: Triton's compiled launcher alone, no key, no stream lookup
        compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *args,
                     *consts.values())

    rows = []
    for name, fn in (("triton jit kernel[grid](...)", jit_launch), ("BoundKernel", bound_launch),
                     ("compiled launcher alone", run_only), ("fused.rms_norm (wrapper + BoundKernel)", full_call)):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):  # the best of five: the host is shared, the floor is what the code costs
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        rows.append({"launch": name, "host_us": best})
        print(f"launch {name:40s} {best:6.1f} us", flush=True)
    rows.append({"triton": triton.__version__})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/kernels.py", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-root", type=Path, default=None,
                        help="another checkout whose kernels are timed beside ours (e.g. one of HEAD~n)")
    parser.add_argument("--sections", default="launch,fused,prefill,split",
                        help="comma-separated subset of launch, fused, prefill, split (default: all)")
    parser.add_argument("--triton-configs", type=int, default=None, metavar="N",
                        help="time only the first N Triton tile configs of the prefill sweep (default: all)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    problem = args.json is not None and check_output_path(args.json, "--json", [])  # before any GPU work
    if problem:
        parser.exit(2, f"error: {problem}\n")
    sections = set(args.sections.split(","))
    unknown = sections - {"launch", "fused", "prefill", "split"}
    if unknown:
        parser.exit(2, f"error: --sections: unknown {', '.join(sorted(unknown))}; expected launch, fused, prefill, "
                       "split\n")
    import torch

    if not torch.cuda.is_available():  # torch's AssertionError or triton's ModuleNotFoundError traceback otherwise
        parser.exit(2, "error: this benchmark times CUDA kernels; it needs a CUDA GPU (and triton)\n")

    from engine.gpu.attention import triton_kernels as kernels

    gen = torch.Generator(device="cuda").manual_seed(0)
    baseline = baseline_fused = None
    if args.baseline_root is not None:
        baseline, baseline_fused = load_baseline(args.baseline_root)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    results["ceilings"] = ceil = ceilings(torch)
    print(f"ceilings: copy {ceil['copy_tb_per_s']:.2f} TB/s, bf16 matmul {ceil['matmul_tflop_per_s']:.0f} TFLOP/s")
    if "launch" in sections:
        results["launch"] = bench_launch(torch)
    if "fused" in sections:
        results["fused"] = bench_fused(torch, baseline_fused, gen)
    if "prefill" in sections:
        results["flash_block_table"] = probe_flash_block_table(torch)
        print(f"torch flash forward with a block table: {results['flash_block_table']}")
        results["flash_attention_impls"] = flash_impls(torch)
        print(f"torch flash attention implementations: {results['flash_attention_impls']}")
        results["prefill"] = bench_prefill(torch, kernels, baseline, gen, args.triton_configs)
    if "split" in sections:
        results["prefill_splits"] = bench_prefill_splits(torch, kernels, gen)
    if args.json:
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
