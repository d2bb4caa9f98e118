"""Triton kernels that fuse the small elementwise work of a decoder layer.

Unfused, RMSNorm, q/k norm with rotary embedding and SiLU-and-mul are ~50 tiny kernels per layer;
in a decode step of a small model their launch floors cost more than the matmuls. Rounding follows
the HF models: values are rounded to the activation dtype where HF rounds them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.gpu.triton_launch import BoundKernel


@triton.jit
def _rms_norm_kernel(
    X, Residual, Weight, Out, stride_x, stride_r, stride_o, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(Residual + row * stride_r + cols, mask=mask, other=0.0)  # rounded like HF's add
        tl.store(Residual + row * stride_r + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    normed = (xf * rstd).to(Out.dtype.element_ty).to(tl.float32)
    w = tl.load(Weight + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_o + cols, (normed * w).to(Out.dtype.element_ty), mask=mask)


_rms_norm = BoundKernel(_rms_norm_kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Normalizes rows of a 2-D ``x``; with ``residual``, first adds it in place (residual += x) and normalizes that.
    Writes into ``out`` when given."""
    rows, cols = x.shape
    out = torch.empty_like(x) if out is None else out
    if rows:
        _rms_norm(
            (rows,),
            (x, residual if residual is not None else x, weight, out,
             x.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0), cols, float(eps)),
            dict(HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(cols)),
            num_warps=4 if cols <= 2048 else 8,
        )
    return out


@triton.jit
def _qk_norm_rope_kernel(
    QKV, Positions, CosSin, QWeight, KWeight,
    stride_t, stride_cs, num_rows, eps,
    NUM_Q_HEADS: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
):
    # One row = one (token, q or k head); the q and k heads of a token are contiguous in its QKV row, so
    # BLOCK_ROWS rows are a few whole tokens' worth of wide, coalesced loads. (One program per head, as
    # before, moved 256 bytes a program and reached a fifth of the memory bandwidth.)
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_mask = rows < num_rows
    token = rows // NUM_HEADS
    head = rows % NUM_HEADS
    half = tl.arange(0, HEAD_DIM // 2)
    base = QKV + (token.to(tl.int64) * stride_t + head * HEAD_DIM)[:, None] + half[None, :]
    mask = row_mask[:, None]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HEAD_DIM // 2, mask=mask, other=0.0)
    if HAS_NORM:
        is_q = (head < NUM_Q_HEADS)[:, None]
        w1 = tl.where(is_q, tl.load(QWeight + half)[None, :], tl.load(KWeight + half)[None, :]).to(tl.float32)
        w2 = tl.where(is_q, tl.load(QWeight + HEAD_DIM // 2 + half)[None, :],
                      tl.load(KWeight + HEAD_DIM // 2 + half)[None, :]).to(tl.float32)
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        rstd = tl.rsqrt((tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1)) / HEAD_DIM + eps)[:, None]
        x1 = ((f1 * rstd).to(x1.dtype).to(tl.float32) * w1).to(x1.dtype)
        x2 = ((f2 * rstd).to(x2.dtype).to(tl.float32) * w2).to(x2.dtype)
    pos = tl.load(Positions + token, mask=row_mask, other=0)
    cs = CosSin + (pos * stride_cs)[:, None] + half[None, :]
    cos = tl.load(cs, mask=mask, other=0.0)
    sin = tl.load(cs + HEAD_DIM // 2, mask=mask, other=0.0)
    f1 = x1.to(tl.float32)
    f2 = x2.to(tl.float32)
    tl.store(base, (f1 * cos - f2 * sin).to(x1.dtype), mask=mask)
    tl.store(base + HEAD_DIM // 2, (f2 * cos + f1 * sin).to(x2.dtype), mask=mask)


_qk_norm_rope = BoundKernel(_qk_norm_rope_kernel)
QK_ROPE_BLOCK_ROWS = 16  # of 16, 32, 64, 128 rows per program, 16 read and wrote fastest (H200, 8,192 tokens)


def qk_norm_rope_(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
) -> None:
    """In place on the fused QKV output [tokens, (Hq + 2 Hkv) * D]: optional per-head RMSNorm of q and k, then
    rotary."""
    tokens = qkv.shape[0]
    if tokens == 0:
        return
    has_norm = q_weight is not None
    num_heads = num_q_heads + num_kv_heads
    num_rows = tokens * num_heads
    _qk_norm_rope(
        (triton.cdiv(num_rows, QK_ROPE_BLOCK_ROWS),),
        (qkv, positions, cos_sin_cache, q_weight if has_norm else qkv, k_weight if has_norm else qkv,
         qkv.stride(0), cos_sin_cache.stride(0), num_rows, float(eps)),
        dict(NUM_Q_HEADS=num_q_heads, NUM_HEADS=num_heads, HEAD_DIM=head_dim, HAS_NORM=has_norm,
             BLOCK_ROWS=QK_ROPE_BLOCK_ROWS),
        num_warps=4,
    )


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(X + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row.to(tl.int64) * stride_x + n_cols + cols, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)  # rounded like HF's silu output
    tl.store(Out + row.to(tl.int64) * stride_o + cols, (act.to(tl.float32) * up.to(tl.float32)).to(up.dtype), mask=mask)


_silu_and_mul = BoundKernel(_silu_and_mul_kernel)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    rows, cols2 = x.shape
    cols = cols2 // 2
    out = torch.empty(rows, cols, dtype=x.dtype, device=x.device)
    if rows:
        block = 1024
        _silu_and_mul((rows, triton.cdiv(cols, block)), (x, out, x.stride(0), out.stride(0), cols),
                      dict(BLOCK=block), num_warps=4)
    return out
