"""Variants of the paged prefill attention kernel against the engine's kernel, on the GPU.

``python benchmarks/prefill_variants.py [--json OUT]`` (needs a CUDA GPU with Triton; the cases of
``benchmarks/kernels.py``).

Issue 16 asks 450 TFLOP/s of causal prefill attention (head dim 128, 2k-8k chunks); ours gives 327-424. Two ideas
from FlashAttention-3/4, each a constexpr of a copy of the engine's kernel (unmasked key tiles through TMA, as the
engine's; masked tiles through the engine's own ``_prefill_tile``):
- PIPE: the score matmul of key tile j+1 issued before the softmax of tile j (FA3's intra-warpgroup overlap), so
  the tensor cores could work while the exponentials run;
- EX2: ``ex2.approx.ftz.f32`` through inline asm instead of ``tl.exp2``.
Each row gives the time, TFLOP/s, the error against the engine's output and the compiled kernel's registers, spills
and shared memory. Measured on an H100 (2026-12-05, ``benchmarks/results/prefill-variants-h100-2026-12-05.json``):
neither helps. EX2 changes nothing (Triton's exp2 is that instruction already); PIPE holds two score tiles live and
spills (94 spills at 4 warps: 2x slower), and even unspilled at 8 warps it is slower than the same tiles without it
(219-287 against 250-326 TFLOP/s): Triton waits for the early matmul before the softmax instead of overlapping
them. The engine's (64, 64, 4 warps, 3 stages, 2 heads, TMA) stays best: 327 / 383 / 423 TFLOP/s on 4 x 2k /
2 x 4k / 8k; its copy here spills 42 registers at 255 and still leads. (That JSON came from this script's first
form, kernels and configs as here, before its command line was added.)
"""
import json
import os
import sys
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, REPO)

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

try:
    import torch
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install: --help works, a run says what it needs
    triton = None

if triton is not None:
    import kernels as kb

    from engine.gpu.attention import triton_kernels as tk
    from engine.gpu.attention.triton_kernels import _prefill_tile

    @triton.jit
    def _ex2(x, EX2: tl.constexpr):
        if EX2:
            return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return tl.exp2(x)


    @triton.jit
    def _softmax_pv(s, acc, m_i, l_i, v, qk_scale, EX2: tl.constexpr):
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = _ex2(s * qk_scale - m_new[:, None], EX2)
        alpha = _ex2(m_i - m_new, EX2)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        return acc, m_new, l_i


    @triton.jit
    def _row(table, tile_start, stride_cb, head_base, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr):
        page = tl.load(table + tile_start // PAGE).to(tl.int64)
        return ((page * stride_cb + head_base) // HEAD_DIM + tile_start % PAGE).to(tl.int32)


    @triton.jit
    def _variant_kernel(
        Q, K_cache, V_cache, Block_tables, Cu_seqlens_q, Context_lens, Out,
        qk_scale, kv_rows,
        stride_qt, stride_qh, stride_cb, stride_ch, stride_ct, stride_bt, stride_ot, stride_oh,
        GROUP: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PIPE: tl.constexpr, EX2: tl.constexpr,
    ):
        tile = tl.num_programs(0) - 1 - tl.program_id(0)
        head0 = tl.program_id(1) * HEADS
        seq = tl.program_id(2)
        q_start = tl.load(Cu_seqlens_q + seq)
        q_len = tl.load(Cu_seqlens_q + seq + 1) - q_start
        if tile * BLOCK_M >= q_len:
            return
        context = tl.load(Context_lens + seq)
        kv_head = head0 // GROUP
        r = tl.arange(0, HEADS * BLOCK_M)
        tokens = tile * BLOCK_M + r % BLOCK_M
        heads = head0 + r // BLOCK_M
        row_mask = tokens < q_len
        dims = tl.arange(0, HEAD_DIM)
        q_rows = (q_start + tokens).to(tl.int64) * stride_qt + heads * stride_qh
        q = tl.load(Q + q_rows[:, None] + dims[None, :], mask=row_mask[:, None], other=0.0)
        q_pos = context + tokens
        kv_end = context + tl.minimum((tile + 1) * BLOCK_M, q_len)
        full_end = (context + tile * BLOCK_M) // BLOCK_N * BLOCK_N
        m_i = tl.full([HEADS * BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([HEADS * BLOCK_M], tl.float32)
        acc = tl.zeros([HEADS * BLOCK_M, HEAD_DIM], tl.float32)
        cols = tl.arange(0, BLOCK_N)
        head_base = kv_head * stride_ch
        table = Block_tables + seq * stride_bt
        k_desc = tl.make_tensor_descriptor(K_cache, shape=[kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(V_cache, shape=[kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        if PIPE:
            if full_end > 0:
                prev = _row(table, 0, stride_cb, head_base, HEAD_DIM, PAGE)
                s = tl.dot(q, k_desc.load([prev, 0]).T)
                for tile_start in range(BLOCK_N, full_end, BLOCK_N):
                    row = _row(table, tile_start, stride_cb, head_base, HEAD_DIM, PAGE)
                    s_next = tl.dot(q, k_desc.load([row, 0]).T)
                    acc, m_i, l_i = _softmax_pv(s, acc, m_i, l_i, v_desc.load([prev, 0]), qk_scale, EX2)
                    s = s_next
                    prev = row
                acc, m_i, l_i = _softmax_pv(s, acc, m_i, l_i, v_desc.load([prev, 0]), qk_scale, EX2)
        else:
            for tile_start in range(0, full_end, BLOCK_N):
                row = _row(table, tile_start, stride_cb, head_base, HEAD_DIM, PAGE)
                s = tl.dot(q, k_desc.load([row, 0]).T)
                acc, m_i, l_i = _softmax_pv(s, acc, m_i, l_i, v_desc.load([row, 0]), qk_scale, EX2)
        for tile_start in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = _prefill_tile(q, acc, m_i, l_i, K_cache, V_cache, table, head_base, tile_start, kv_end,
                                          q_pos, qk_scale, cols, dims, stride_cb, stride_ct, PAGE, True)
        safe_l = tl.where(l_i > 0, l_i, 1.0)
        out = acc / safe_l[:, None]
        o_rows = (q_start + tokens).to(tl.int64) * stride_ot + heads * stride_oh
        tl.store(Out + o_rows[:, None] + dims[None, :], out.to(Out.dtype.element_ty), mask=row_mask[:, None])


def variant(q, k_cache, v_cache, tables, cu, ctx, max_q, scale, out, cfg):
    block_m, block_n, warps, stages, heads, pipe, ex2 = cfg
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[1]
    grid = (triton.cdiv(max_q, block_m), num_heads // heads, cu.shape[0] - 1)
    return _variant_kernel[grid](
        q, k_cache, v_cache, tables, cu, ctx, out, scale * tk.LOG2E, k_cache.numel() // head_dim,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEADS=heads, HEAD_DIM=head_dim, PAGE=k_cache.shape[2], BLOCK_M=block_m, BLOCK_N=block_n,
        PIPE=pipe, EX2=ex2, num_warps=warps, num_stages=stages)


# (BLOCK_M, BLOCK_N, warps, stages, heads, PIPE, EX2)
CONFIGS = [
    (64, 64, 4, 3, 2, False, False),  # the engine's config through this kernel (control)
    (64, 64, 4, 3, 2, False, True),
    (64, 64, 4, 3, 2, True, False),
    (64, 64, 4, 3, 2, True, True),
    (64, 64, 4, 2, 2, True, False),
    (64, 64, 8, 3, 2, True, False),
    (64, 128, 8, 3, 2, True, False),
    (64, 128, 8, 2, 2, True, False),
    (128, 64, 8, 3, 2, True, False),
    (128, 128, 8, 2, 1, True, False),
    (64, 32, 4, 3, 2, True, False),
    (64, 64, 4, 4, 2, True, False),
    (64, 64, 8, 3, 2, False, False),
    (64, 128, 8, 3, 2, False, False),
]


def bench_case(q_lens, prefix, gen) -> list[dict]:
    q, k, v, k_cache, v_cache, tables, cu, ctx = kb.prefill_inputs(torch, q_lens, prefix, gen)
    positions = torch.cat([torch.arange(prefix, prefix + n, device="cuda") for n in q_lens])
    slots = torch.cat([(tables[i, (positions[int(cu[i]):int(cu[i + 1])] // kb.PAGE)].long() * kb.PAGE
                        + positions[int(cu[i]):int(cu[i + 1])] % kb.PAGE) for i in range(len(q_lens))])
    tk.store_kv(k, v, k_cache, v_cache, slots)
    flops = kb.causal_flops(q_lens, prefix)
    case = f"{len(q_lens)}x{q_lens[0]}" + (f"+prefix{prefix}" if prefix else "")
    max_q, scale = max(q_lens), kb.D ** -0.5
    inputs = (q, k_cache, v_cache, tables, cu, ctx, max_q, scale)
    ref = tk.paged_prefill(*inputs)
    out0 = torch.empty_like(q)
    ms = kb.bench_ms(lambda: tk.paged_prefill(*inputs, out=out0))
    rows = [{"case": case, "kernel": "engine", "ms": ms, "tflop_per_s": flops / ms / 1e9}]
    print(f"{case:18s} engine {ms:7.3f} ms {rows[0]['tflop_per_s']:6.1f}", flush=True)
    for cfg in CONFIGS:
        out = torch.empty_like(q)
        try:
            compiled = variant(*inputs, out, cfg)
            torch.cuda.synchronize()
            ms = kb.bench_ms(lambda cfg=cfg, out=out: variant(*inputs, out, cfg))
        except Exception as exc:  # a variant that does not compile: say so, go on
            print(f"{case:18s} {cfg} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            rows.append({"case": case, "kernel": str(cfg), "error": str(exc)[:300]})
            continue
        row = {"case": case, "kernel": str(cfg), "ms": ms, "tflop_per_s": flops / ms / 1e9,
               "rel_err": kb.rel_err(out, ref), "n_regs": getattr(compiled, "n_regs", None),
               "n_spills": getattr(compiled, "n_spills", None),
               "shared": getattr(getattr(compiled, "metadata", None), "shared", None)}
        rows.append(row)
        print(f"{case:18s} {str(cfg):40s} {ms:7.3f} ms {row['tflop_per_s']:6.1f} err {row['rel_err']:.1e} "
              f"regs {row['n_regs']} spills {row['n_spills']} smem {row['shared']}", flush=True)
    return rows


def main():
    parser = OneLineErrorParser(prog="python benchmarks/prefill_variants.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "prefill-variants.json"),
                        help="where to write the rows (default: $OUT or . / prefill-variants.json)")
    args = parser.parse_args()
    problem = args.json is not None and check_output_path(args.json, "--json", [])  # before any GPU work
    if problem:
        parser.exit(2, f"error: {problem}\n")
    if triton is None or not torch.cuda.is_available():
        parser.error("needs a CUDA GPU and Triton")
    gen = torch.Generator(device="cuda").manual_seed(0)
    tk._use_scratch_allocator()
    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": []}
    for q_lens, prefix in kb.PREFILL_CASES:
        results["rows"] += bench_case(q_lens, prefix, gen)
        torch.cuda.empty_cache()
    write_text_atomic(Path(args.json), json.dumps(results, indent=1))


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    one_line_script_errors(main)()
