"""The default CUDA backend: our Triton kernels over the paged cache."""

from __future__ import annotations

import torch

from engine.attention import triton_kernels as kernels
from engine.attention.metadata import AttentionMetadata


class TritonBackend:
    name = "triton"

    @staticmethod
    def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_blocks, num_kv_heads, block_size, head_dim)

    @staticmethod
    def store(k, v, k_cache, v_cache, slot_mapping) -> None:
        kernels.store_kv(k, v, k_cache, v_cache, slot_mapping)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        num_decode = meta.num_decode_tokens
        if num_decode:
            kernels.paged_decode(
                q[:num_decode],
                k_cache,
                v_cache,
                meta.decode_block_tables,
                meta.decode_context_lens,
                scale,
                meta.decode_num_splits,
                out=out[:num_decode],
            )
        if meta.num_prefill_seqs:
            kernels.paged_prefill(
                q[num_decode:],
                k_cache,
                v_cache,
                meta.prefill_block_tables,
                meta.prefill_cu_seqlens_q,
                meta.prefill_context_lens,
                meta.prefill_max_q_len,
                scale,
                out=out[num_decode:],
            )
        return out
