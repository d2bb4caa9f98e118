"""Reference attention in plain PyTorch: gathers each sequence's KV from the paged cache and calls SDPA.

Slow (a loop over sequences) but obviously right; the CPU path, and the yardstick for the kernels.
Cache layout per layer: [num_blocks, num_kv_heads, block_size, head_dim].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


class TorchBackend:
    name = "torch"

    @staticmethod
    def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (num_blocks, num_kv_heads, block_size, head_dim)

    @staticmethod
    def store(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        block_size = k_cache.shape[2]
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        blocks, offsets = slots // block_size, slots % block_size
        k_cache[blocks, :, offsets] = k[keep].to(k_cache.dtype)
        v_cache[blocks, :, offsets] = v[keep].to(v_cache.dtype)

    @staticmethod
    def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
        """[length, kv_heads, head_dim] for one sequence."""
        block_size = cache.shape[2]
        num_blocks = -(-length // block_size)
        pages = cache[block_table[:num_blocks].long()]  # [n, H, bs, D]
        return pages.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])[:length]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_context: int, scale: float) -> torch.Tensor:
        """q: [n, Hq, D] at positions num_context..num_context+n-1; k, v: [num_context+n, Hkv, D]."""
        n, num_heads, _ = q.shape
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        q_pos = torch.arange(num_context, num_context + n, device=q.device).unsqueeze(1)
        k_pos = torch.arange(k.shape[1], device=q.device).unsqueeze(0)
        mask = k_pos <= q_pos
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale)
        return out.transpose(0, 1)

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
            lens = meta.host_decode_context_lens
            for i in range(num_decode):
                length = lens[i]
                if length == 0:  # padding row
                    out[i] = 0
                    continue
                kk = self._gather(k_cache, meta.decode_block_tables[i], length).to(q.dtype)
                vv = self._gather(v_cache, meta.decode_block_tables[i], length).to(q.dtype)
                out[i : i + 1] = self._attend(q[i : i + 1], kk, vv, length - 1, scale)
        start = num_decode
        for j in range(meta.num_prefill_seqs):
            n = meta.host_prefill_q_lens[j]
            context = meta.host_prefill_context_lens[j]
            kk = self._gather(k_cache, meta.prefill_block_tables[j], context + n).to(q.dtype)
            vv = self._gather(v_cache, meta.prefill_block_tables[j], context + n).to(q.dtype)
            out[start : start + n] = self._attend(q[start : start + n], kk, vv, context, scale)
            start += n
        return out
