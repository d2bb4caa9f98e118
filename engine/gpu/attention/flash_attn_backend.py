"""Attention through the flash-attn package (used only when it is importable).

Cache layout per layer: [num_blocks, block_size, num_kv_heads, head_dim], as flash-attn's paged API
expects; FlashAttention-2 needs the block size to be a multiple of 256 for paged KV.
"""

from __future__ import annotations

import torch

from engine.gpu.attention import triton_kernels as kernels
from engine.gpu.attention.base import PagedAttentionBackend


class FlashAttnBackend(PagedAttentionBackend):
    name = "flash_attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    @staticmethod
    def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        if block_size % 256:
            raise ValueError(f"the flash_attn backend needs block_size to be a multiple of 256, got {block_size}")
        return (num_blocks, block_size, num_kv_heads, head_dim)

    def store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        kernels.store_kv(k, v, k_cache, v_cache, slot_mapping, heads_first=False)

    def decode(self, q, k_cache, v_cache, meta, scale, out) -> None:
        out.copy_(self._with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.decode_context_lens,
                                     block_table=meta.decode_block_tables, softmax_scale=scale, causal=True).squeeze(1))

    def prefill(self, q, k_cache, v_cache, meta, scale, out) -> None:
        cu_k = torch.zeros_like(meta.prefill_cu_seqlens_q)
        torch.cumsum(meta.prefill_context_lens + meta.prefill_cu_seqlens_q.diff(), 0, out=cu_k[1:])
        out.copy_(self._varlen(q, k_cache, v_cache, cu_seqlens_q=meta.prefill_cu_seqlens_q, cu_seqlens_k=cu_k,
                               max_seqlen_q=meta.prefill_max_q_len, max_seqlen_k=meta.prefill_max_k_len,
                               softmax_scale=scale, causal=True, block_table=meta.prefill_block_tables))
