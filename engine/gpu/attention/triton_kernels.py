"""Triton kernels for the paged KV cache (layout per layer: [num_blocks, num_kv_heads, block_size, head_dim]).

- ``store_kv``: writes each new token's K and V to its slot (slot -1: padding, skipped).
- ``paged_decode``: one query token per sequence against its whole paged context. Split-KV
  (flash-decoding): the context is cut into ranges handled by separate programs, whose partial
  results are merged by their log-sum-exp, so small batches still fill the GPU; the few longest
  contexts of a batch get more ranges, scheduled first, and the other rows start longest first, so
  none becomes a straggler.
  The query heads sharing a KV head are processed together, so each KV tile is read once.
- ``paged_prefill``: a chunk of query tokens per sequence, causal, against its cached prefix and
  itself (already stored), read through the block table.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.gpu.attention.triton_kernels_host import (
    DECODE_TILE_TOKENS,
    prefill_num_splits,
    reachable_decode_splits,
    reachable_prefill_splits,
)
from engine.gpu.triton_launch import BoundKernel, Launch

LOG2E = 1.4426950408889634


@triton.jit
def _store_kv_kernel(
    K, V, K_cache, V_cache, Slots,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_ch, stride_ct,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(Slots + token)
    if slot < 0:
        return
    page = slot // PAGE
    offset = slot % PAGE
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < NUM_KV_HEADS)[:, None]
    k = tl.load(K + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(V + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    dst = page.to(tl.int64) * stride_cb + heads[:, None] * stride_ch + offset * stride_ct + dims[None, :]
    tl.store(K_cache + dst, k.to(K_cache.dtype.element_ty), mask=mask)
    tl.store(V_cache + dst, v.to(V_cache.dtype.element_ty), mask=mask)


_store_kv = BoundKernel(_store_kv_kernel)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    heads_first: bool = True,
) -> None:
    """Caches are [blocks, kv_heads, page, head_dim] (``heads_first``) or [blocks, page, kv_heads, head_dim]."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
    head_dim_index, token_dim_index = (1, 2) if heads_first else (2, 1)
    _store_kv(
        (num_tokens,),
        (k, v, k_cache, v_cache, slots,
         k.stride(0), k.stride(1), v.stride(0), v.stride(1),
         k_cache.stride(0), k_cache.stride(head_dim_index), k_cache.stride(token_dim_index)),
        dict(NUM_KV_HEADS=num_kv_heads, HEADS_PAD=triton.next_power_of_2(num_kv_heads), HEAD_DIM=head_dim,
             PAGE=k_cache.shape[token_dim_index]),
    )


@triton.jit
def _seq_num_splits(Long_seqs, seq, FILL_SPLITS: tl.constexpr, NUM_SPLITS: tl.constexpr, NUM_LONG: tl.constexpr):
    """FILL_SPLITS ranges for a sequence, NUM_SPLITS for one of the (at most NUM_LONG) long ones."""
    if NUM_LONG > 0:
        longs = tl.load(Long_seqs + tl.arange(0, NUM_LONG))
        is_long = tl.sum((longs == seq).to(tl.int32), 0) > 0
        return tl.where(is_long, NUM_SPLITS, FILL_SPLITS)
    else:
        return FILL_SPLITS


@triton.jit
def _paged_decode_kernel(
    Q, K_cache, V_cache, Block_tables, Context_lens, Long_seqs, Row_order, Out, Part_out, Part_lse,
    qk_scale,  # softmax scale * log2(e)
    stride_qt, stride_qh,
    stride_cb, stride_ch, stride_ct,
    stride_bt,
    stride_ot, stride_oh,
    stride_pt, stride_ph, stride_ps,
    stride_lt, stride_lh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, FILL_SPLITS: tl.constexpr, NUM_LONG: tl.constexpr,
    ORDERED: tl.constexpr,
):
    # Grid (KV head, work item). The first NUM_LONG * (NUM_SPLITS - FILL_SPLITS) items are the further
    # ranges of the few long sequences the host named in Long_seqs (-1: none), so they start first; then
    # FILL_SPLITS ranges of every sequence, in Row_order when ORDERED (the host sorts the rows by context,
    # longest first). The GPU starts programs in grid order, and a large batch runs in several waves of
    # them: a long row left to the last wave finished alone, long after the rest (the batch's contexts are
    # as short on average, the step much longer). One launch: a second one would run only after this one.
    kv_head = tl.program_id(0)
    item = tl.program_id(1)
    NUM_EXTRA: tl.constexpr = NUM_SPLITS - FILL_SPLITS
    if NUM_LONG > 0:
        if item < NUM_LONG * NUM_EXTRA:
            seq = tl.load(Long_seqs + item // NUM_EXTRA)
            split = FILL_SPLITS + item % NUM_EXTRA
        else:
            seq = (item - NUM_LONG * NUM_EXTRA) // FILL_SPLITS
            split = (item - NUM_LONG * NUM_EXTRA) % FILL_SPLITS
            if ORDERED:
                seq = tl.load(Row_order + seq)
    else:
        seq = item // FILL_SPLITS
        split = item % FILL_SPLITS
        if ORDERED:
            seq = tl.load(Row_order + seq)
    if seq < 0:
        return
    context = tl.load(Context_lens + seq)
    num_tiles = tl.cdiv(context, BLOCK_N)
    seq_splits = _seq_num_splits(Long_seqs, seq, FILL_SPLITS, NUM_SPLITS, NUM_LONG)
    tiles_per_split = tl.cdiv(num_tiles, seq_splits)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context)

    rows = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    row_mask = rows < GROUP
    q = tl.load(Q + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=row_mask[:, None], other=0.0)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    head_base = kv_head * stride_ch
    table = Block_tables + seq * stride_bt
    for tile_start in range(start, end, BLOCK_N):
        page = tl.load(table + tile_start // PAGE).to(tl.int64)
        offs = tile_start + cols
        valid = offs < end
        kv_off = page * stride_cb + head_base + (offs % PAGE)[:, None] * stride_ct + dims[None, :]
        k = tl.load(K_cache + kv_off, mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_cache + kv_off, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if seq_splits == 1:  # the whole context in this program: no merge
        tl.store(Out + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=row_mask[:, None])
    else:
        tl.store(Part_out + seq * stride_pt + heads[:, None] * stride_ph + split * stride_ps + dims[None, :],
                 out, mask=row_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))  # base-2 log-sum-exp
        tl.store(Part_lse + seq * stride_lt + heads * stride_lh + split, lse, mask=row_mask)


@triton.jit
def _merge_splits_kernel(
    Part_out, Part_lse, Long_seqs, Out,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, FILL_SPLITS: tl.constexpr, NUM_LONG: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, HEAD_DIM)
    seq_splits = _seq_num_splits(Long_seqs, seq, FILL_SPLITS, NUM_SPLITS, NUM_LONG)
    if seq_splits == 1:  # written straight to Out by its one program
        return
    written = splits < seq_splits
    lse = tl.load(Part_lse + seq * stride_lt + head * stride_lh + splits, mask=written, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    used = lse > float("-inf")  # splits past this sequence's count wrote nothing: their garbage x 0 could be NaN
    part = tl.load(Part_out + seq * stride_pt + head * stride_ph + splits[:, None] * stride_ps + dims[None, :],
                   mask=used[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(Out + seq * stride_ot + head * stride_oh + dims, out.to(Out.dtype.element_ty))


_paged_decode = BoundKernel(_paged_decode_kernel)
_merge_splits = BoundKernel(_merge_splits_kernel)


def paged_decode(q: torch.Tensor, *args, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """``paged_decode_launches(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, out,
    fill_splits=None, long_seqs=None)`` issued now; ``out`` is allocated when not given.

    q: [num_seqs, num_heads, head_dim] -> [num_seqs, num_heads, head_dim]. Each context is cut into
    ``fill_splits`` ranges (default: ``num_splits``); the sequences listed in ``long_seqs`` (int32 row
    indices, -1 for an unused slot) into ``num_splits``. See ``DecodeSplits``. ``row_order``: see
    ``paged_decode_launches``.
    """
    out = torch.empty_like(q) if out is None else out
    for launch in paged_decode_launches(q, *args, out=out, **kwargs):
        launch()
    return out


def paged_decode_launches(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor,
    fill_splits: int | None = None,
    long_seqs: torch.Tensor | None = None,
    row_order: torch.Tensor | None = None,
) -> list[Launch]:
    """``paged_decode``'s launches into ``out``, built but not issued (their split buffers allocated once).
    ``row_order`` (int32, a permutation of the rows; ``decode_row_order``) is the order their programs start in."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    fill = num_splits if fill_splits is None else fill_splits
    assert 1 <= fill <= num_splits
    num_long = 0 if long_seqs is None or fill == num_splits else long_seqs.shape[0]
    assert num_long & (num_long - 1) == 0, "the long-sequence slots must be a power of two"
    if num_seqs == 0:
        return []
    block_n = min(DECODE_TILE_TOKENS, page)
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    longs = long_seqs if num_long else context_lens  # unused when num_long == 0
    order = context_lens if row_order is None else row_order  # unused when None
    args = (
        q, k_cache, v_cache, block_tables, context_lens, longs, order, out, part_out, part_lse,
        scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if num_splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1),
    )
    constants = dict(
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, PAGE=page,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, FILL_SPLITS=fill, NUM_LONG=num_long, ORDERED=row_order is not None,
    )
    launches = [Launch(_paged_decode, (num_kv_heads, num_long * (num_splits - fill) + num_seqs * fill), args,
                       constants, num_warps=4, num_stages=3, takes_kv_cache=True)]
    if num_splits > 1:
        launches.append(Launch(
            _merge_splits,
            (num_seqs, num_heads),
            (part_out, part_lse, longs, out,
             part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0), part_lse.stride(1),
             out.stride(0), out.stride(1)),
            dict(HEAD_DIM=head_dim, NUM_SPLITS=num_splits, FILL_SPLITS=fill, NUM_LONG=num_long),
            num_warps=4,
        ))
    return launches


@triton.jit
def _prefill_tile(q, acc, m_i, l_i, K_cache, V_cache, table, head_base, tile_start, kv_end, q_pos, qk_scale,
                  cols, dims, stride_cb, stride_ct, PAGE: tl.constexpr, MASKED: tl.constexpr):
    page = tl.load(table + tile_start // PAGE).to(tl.int64)
    offs = tile_start + cols
    kv_off = page * stride_cb + head_base + (offs % PAGE)[:, None] * stride_ct + dims[None, :]
    if MASKED:
        valid = offs < kv_end
        k = tl.load(K_cache + kv_off, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(K_cache + kv_off)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where(valid[None, :] & (offs[None, :] <= q_pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(V_cache + kv_off, mask=valid[:, None], other=0.0)
    else:
        v = tl.load(V_cache + kv_off)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _prefill_tile_tma(q, acc, m_i, l_i, k_desc, v_desc, row, qk_scale):
    """An unmasked key tile read by the tensor-memory accelerator from ``row`` of the cache's [rows, head_dim]
    view (the tile lies in one page: BLOCK_N divides the page): no address arithmetic per element, and the
    loads run asynchronously ahead of the matmuls that use them."""
    k = k_desc.load([row, 0])
    s = tl.dot(q, k.T)
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = v_desc.load([row, 0])
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _paged_prefill_kernel(
    Q, K_cache, V_cache, Block_tables, Cu_seqlens_q, Context_lens, Out, Part_out, Part_lse,
    qk_scale, kv_rows,
    stride_qt, stride_qh,
    stride_cb, stride_ch, stride_ct,
    stride_bt,
    stride_ot, stride_oh,
    stride_pt, stride_ph, stride_ps,
    stride_lt, stride_lh,
    GROUP: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, TMA: tl.constexpr,
):
    # A program takes BLOCK_M query tokens of HEADS query heads that share one KV head: its
    # HEADS * BLOCK_M rows read each K/V tile once. Causal work grows with the tile index, so the last
    # query tiles start first and the short ones fill the launch's tail.
    # With NUM_SPLITS > 1 (a short chunk on a long cached prefix: few query tiles, many key tiles) each
    # query tile's keys are cut into NUM_SPLITS ranges of whole tiles, one program each, whose partial
    # results _merge_splits_kernel combines by their log-sum-exp, as split-KV decode does.
    split = tl.program_id(0) % NUM_SPLITS
    tile = tl.num_programs(0) // NUM_SPLITS - 1 - tl.program_id(0) // NUM_SPLITS
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
    # Key tiles wholly at or before this tile's first query position need no mask; only the few on the
    # diagonal (and the last, partial one) do.
    full_end = (context + tile * BLOCK_M) // BLOCK_N * BLOCK_N

    m_i = tl.full([HEADS * BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([HEADS * BLOCK_M], tl.float32)
    acc = tl.zeros([HEADS * BLOCK_M, HEAD_DIM], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    head_base = kv_head * stride_ch
    table = Block_tables + seq * stride_bt
    start = 0
    end = kv_end
    if NUM_SPLITS > 1:
        tiles_per_split = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), NUM_SPLITS)
        start = split * tiles_per_split * BLOCK_N
        end = tl.minimum(start + tiles_per_split * BLOCK_N, kv_end)
    if TMA:  # the cache as [kv_rows, HEAD_DIM] rows (heads-first pages, stride_ct == HEAD_DIM)
        k_desc = tl.make_tensor_descriptor(K_cache, shape=[kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(V_cache, shape=[kv_rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        for tile_start in range(start, tl.minimum(full_end, end), BLOCK_N):
            page = tl.load(table + tile_start // PAGE).to(tl.int64)
            row = ((page * stride_cb + head_base) // HEAD_DIM + tile_start % PAGE).to(tl.int32)
            acc, m_i, l_i = _prefill_tile_tma(q, acc, m_i, l_i, k_desc, v_desc, row, qk_scale)
    else:
        for tile_start in range(start, tl.minimum(full_end, end), BLOCK_N):
            acc, m_i, l_i = _prefill_tile(q, acc, m_i, l_i, K_cache, V_cache, table, head_base, tile_start, kv_end,
                                          q_pos, qk_scale, cols, dims, stride_cb, stride_ct, PAGE, False)
    for tile_start in range(tl.maximum(full_end, start), end, BLOCK_N):
        acc, m_i, l_i = _prefill_tile(q, acc, m_i, l_i, K_cache, V_cache, table, head_base, tile_start, kv_end,
                                      q_pos, qk_scale, cols, dims, stride_cb, stride_ct, PAGE, True)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    q_tokens = (q_start + tokens).to(tl.int64)
    if NUM_SPLITS == 1:
        o_rows = q_tokens * stride_ot + heads * stride_oh
        tl.store(Out + o_rows[:, None] + dims[None, :], out.to(Out.dtype.element_ty), mask=row_mask[:, None])
    else:
        p_rows = q_tokens * stride_pt + heads * stride_ph + split * stride_ps
        tl.store(Part_out + p_rows[:, None] + dims[None, :], out, mask=row_mask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))  # base-2 log-sum-exp; -inf: no keys
        tl.store(Part_lse + q_tokens * stride_lt + heads * stride_lh + split, lse, mask=row_mask)


_paged_prefill = BoundKernel(_paged_prefill_kernel)
# (BLOCK_M query tokens, BLOCK_N keys, num_warps, num_stages, query heads per program[, TMA]) for long and
# for short chunks; BLOCK_N is capped by the page, the heads by the group. benchmarks/kernels.py sweeps these:
# two heads of 64 tokens per program was fastest on 2k-8k chunks and with a cached prefix on the H200, and
# loading the unmasked key tiles through tensor descriptors (TMA) made it 9-17 % faster there
# (benchmarks/results/kernels-prefill-tma-h200.json).
PREFILL_CONFIG_LONG = (64, 64, 4, 3, 2, True)
PREFILL_CONFIG_SHORT = (64, 64, 4, 2, 1)


def paged_prefill(q: torch.Tensor, *args, out: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    """``paged_prefill_launches(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, max_q_len, scale,
    out, config=None, num_splits=1, max_k_len=0)`` issued now; ``out`` is allocated when not given.

    q: [prefill tokens, num_heads, head_dim] (chunks back to back) -> same shape. ``config`` overrides
    the (BLOCK_M, BLOCK_N, num_warps, num_stages, heads per program) choice; ``num_splits`` (a power of two)
    cuts each query tile's keys into that many ranges; None: ``prefill_num_splits`` chooses from
    ``max_k_len``, the longest cached prefix + chunk.
    """
    out = torch.empty_like(q) if out is None else out
    for launch in paged_prefill_launches(q, *args, out=out, **kwargs):
        launch()
    return out


def paged_prefill_launches(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_q_len: int,
    scale: float,
    out: torch.Tensor,
    config: tuple[int, int, int, int, int] | None = None,
    num_splits: int | None = 1,
    max_k_len: int = 0,
) -> list[Launch]:
    """``paged_prefill``'s launches into ``out`` (and the merge of its splits), built but not issued."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, page = k_cache.shape[1], k_cache.shape[2]
    num_seqs = cu_seqlens_q.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return []
    block_m, block_n, num_warps, num_stages, heads, *tma = config or (
        PREFILL_CONFIG_LONG if max_q_len > 64 else PREFILL_CONFIG_SHORT)
    tma = bool(tma and tma[0]) and page % block_n == 0 and k_cache.stride(2) == head_dim and k_cache.is_contiguous()
    if tma:
        _use_scratch_allocator()
    group = num_heads // num_kv_heads
    while group % heads:  # a program's heads must share their KV head
        heads //= 2
    block_n = min(block_n, page)
    num_q_tiles = triton.cdiv(max_q_len, block_m)
    if num_splits is None:
        num_splits = prefill_num_splits(num_q_tiles * (num_heads // heads) * num_seqs, max_k_len, block_n,
                                        _num_sms(q.device))
    assert num_splits >= 1 and num_splits & (num_splits - 1) == 0, "num_splits must be a power of two"
    if num_splits > 1:
        part_out = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_strides = (part_out.stride(0), part_out.stride(1), part_out.stride(2), part_lse.stride(0),
                        part_lse.stride(1))
    else:
        part_out = part_lse = out  # unused
        part_strides = (0, 0, 0, 0, 0)
    grid = (num_q_tiles * num_splits, num_heads // heads, num_seqs)
    launches = [Launch(
        _paged_prefill,
        grid,
        (q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, part_out, part_lse,
         scale * LOG2E, k_cache.numel() // head_dim,
         q.stride(0), q.stride(1),
         k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
         block_tables.stride(0),
         out.stride(0), out.stride(1),
         *part_strides),
        dict(GROUP=group, HEADS=heads, HEAD_DIM=head_dim, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n,
             NUM_SPLITS=num_splits, TMA=tma),
        num_warps=num_warps, num_stages=num_stages, takes_kv_cache=True,
    )]
    if num_splits > 1:  # every row has num_splits ranges; the merge kernel's rows are the chunk tokens
        launches.append(Launch(
            _merge_splits,
            (num_tokens, num_heads),
            (part_out, part_lse, part_lse, out, *part_strides, out.stride(0), out.stride(1)),
            dict(HEAD_DIM=head_dim, NUM_SPLITS=num_splits, FILL_SPLITS=num_splits, NUM_LONG=0),
            num_warps=4,
        ))
    return launches


def warm_up(k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, max_model_len: int, max_num_seqs: int,
            table_width: int) -> int:
    """Launch once every variant of the paged attention kernels that an eager step can need (decode with
    each reachable ``DecodeSplits``; prefill with either tile configuration and each reachable number of
    key ranges; their merges), on one-token inputs; returns the number of variants.

    Triton compiles a variant the first time a step needs it: seconds each on a machine whose cache is
    cold, which showed up as TTFT spikes in the first minute of serving. Variants are told apart by their
    constexprs and by which integer arguments are 1 or multiples of 16, so the inputs keep the real
    block-table width (``table_width``) and strides of the same kind as a step's."""
    device, dtype = k_cache.device, k_cache.dtype
    num_kv_heads, page, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    num_sms = _num_sms(device)
    count = 0
    for splits in reachable_decode_splits(num_kv_heads, max_model_len, max_num_seqs, num_sms):
        rows = max(1, splits.num_long_seqs)
        q = torch.zeros(rows, num_heads, head_dim, dtype=dtype, device=device)
        tables = torch.zeros(rows, table_width, dtype=torch.int32, device=device)
        context = torch.ones(rows, dtype=torch.int32, device=device)
        long_seqs = None
        if splits.num_long_seqs:
            long_seqs = torch.full((splits.num_long_seqs,), -1, dtype=torch.int32, device=device)
            long_seqs[0] = 0
        paged_decode(q, k_cache, v_cache, tables, context, 1.0, splits.num_splits, fill_splits=splits.fill_splits,
                     long_seqs=long_seqs, row_order=torch.arange(rows, dtype=torch.int32, device=device))
        count += 1
    for config, max_q_len in ((PREFILL_CONFIG_SHORT, 1), (PREFILL_CONFIG_LONG, 65)):
        q = torch.zeros(max_q_len, num_heads, head_dim, dtype=dtype, device=device)
        tables = torch.zeros(1, table_width, dtype=torch.int32, device=device)
        cu_seqlens = torch.tensor([0, max_q_len], dtype=torch.int32, device=device)
        context = torch.zeros(1, dtype=torch.int32, device=device)
        for num_splits in reachable_prefill_splits(max_model_len, min(config[1], page), num_sms):
            paged_prefill(q, k_cache, v_cache, tables, cu_seqlens, context, max_q_len, 1.0, num_splits=num_splits,
                          max_k_len=max_q_len)
            count += 1
    return count


class _Scratch:
    """Triton's allocator for kernels that build tensor descriptors on the device (128 bytes per descriptor and
    program): one buffer per device, grown when a launch needs more. Launches on one stream run one after
    another, so they can share it."""

    def __init__(self) -> None:
        self.buffers: dict[int, torch.Tensor] = {}

    def __call__(self, size: int, alignment: int, stream) -> torch.Tensor:
        device = torch.cuda.current_device()
        buf = self.buffers.get(device)
        if buf is None or buf.numel() < size:
            buf = self.buffers[device] = torch.empty(max(size, 1 << 20), dtype=torch.int8, device=device)
        return buf


_SCRATCH = _Scratch()


def _use_scratch_allocator() -> None:
    triton.set_allocator(_SCRATCH)  # a context variable: set in each launching thread


_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]
