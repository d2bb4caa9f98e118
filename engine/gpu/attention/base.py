"""What every attention backend shares: the step's layout (decode rows, then prefill chunks) and the
output buffer; a backend supplies the cache layout, the KV store, and its decode and prefill paths."""

from __future__ import annotations

import torch

from engine.gpu.attention.metadata import AttentionMetadata


class PagedAttentionBackend:
    name = "base"

    @staticmethod
    def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Per-layer K (and V) cache shape; the default puts heads first: [blocks, kv_heads, block, dim]."""
        return (num_blocks, num_kv_heads, block_size, head_dim)

    def store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        raise NotImplementedError

    def decode(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor) -> None:
        raise NotImplementedError

    def prefill(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor) -> None:
        raise NotImplementedError

    def warm_up(self, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int, max_model_len: int,
                max_num_seqs: int, table_width: int) -> int:
        """Compile ahead what the backend would otherwise compile during serving; the number of variants."""
        return 0

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention for every new token (its K/V already stored) into ``out`` [tokens, heads, dim]."""
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        num_decode = meta.num_decode_tokens
        if num_decode:
            self.decode(q[:num_decode], k_cache, v_cache, meta, scale, out[:num_decode])
        if meta.num_prefill_seqs:
            self.prefill(q[num_decode:], k_cache, v_cache, meta, scale, out[num_decode:])
        return out

    def per_layer(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, scale: float,
                  out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """One step's attention as a callable ``(k_cache, v_cache)`` that every layer calls in turn (the rows,
        metadata and output are the same for every layer; ``k_cache``/``v_cache`` are layer 0's, a template).
        A backend may prepare the launches once here; this default simply runs ``forward``."""
        return lambda layer_k_cache, layer_v_cache: self.forward(q, k, v, layer_k_cache, layer_v_cache, meta, scale,
                                                                 out)
