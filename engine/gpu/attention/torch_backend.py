"""Reference attention in plain PyTorch: gathers each sequence's KV from the paged cache and calls SDPA.

Slow (a loop over sequences) but obviously right; the CPU path, and the yardstick for the kernels.
Cache layout per layer: [num_blocks, num_kv_heads, block_size, head_dim].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.core.config import cdiv
from engine.gpu.attention.base import PagedAttentionBackend


class TorchBackend(PagedAttentionBackend):
    name = "torch"

    def store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
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
        num_blocks = cdiv(length, block_size)
        pages = cache[block_table[:num_blocks].long()]  # [n, H, bs, D]
        return pages.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], cache.shape[3])[:length]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_context: int,
                scale: float) -> torch.Tensor:
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

    def _sequence(self, q, k_cache, v_cache, table, num_context: int, scale: float) -> torch.Tensor:
        length = num_context + q.shape[0]
        kk = self._gather(k_cache, table, length).to(q.dtype)
        vv = self._gather(v_cache, table, length).to(q.dtype)
        return self._attend(q, kk, vv, num_context, scale)

    def decode(self, q, k_cache, v_cache, meta, scale, out) -> None:
        for i, length in enumerate(meta.host_decode_context_lens):
            if length == 0:  # padding row
                out[i] = 0
            else:
                out[i : i + 1] = self._sequence(q[i : i + 1], k_cache, v_cache, meta.decode_block_tables[i], length - 1,
                                                scale)

    def prefill(self, q, k_cache, v_cache, meta, scale, out) -> None:
        start = 0
        for j, (n, context) in enumerate(zip(meta.host_prefill_q_lens, meta.host_prefill_context_lens)):
            out[start : start + n] = self._sequence(q[start : start + n], k_cache, v_cache,
                                                    meta.prefill_block_tables[j], context, scale)
            start += n
