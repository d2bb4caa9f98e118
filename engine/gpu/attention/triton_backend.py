"""The default CUDA backend: our Triton kernels over the paged cache."""

from __future__ import annotations

import torch

from engine.gpu.attention import triton_kernels as kernels
from engine.gpu.attention.base import PagedAttentionBackend
from engine.gpu.triton_launch import Launch, OverlappedLaunches, PerLayerLaunches


class TritonBackend(PagedAttentionBackend):
    name = "triton"

    def __init__(self, overlap_decode: bool = False) -> None:
        # Mixed steps run decode attention on a side stream beside prefill attention (OverlappedLaunches): the
        # engine option overlap_decode_attention.
        self.overlap_decode = overlap_decode
        self._side_stream = None

    def store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        kernels.store_kv(k, v, k_cache, v_cache, slot_mapping)

    def decode(self, q, k_cache, v_cache, meta, scale, out) -> None:
        for launch in self._decode_launches(q, k_cache, v_cache, meta, scale, out):
            launch()

    def prefill(self, q, k_cache, v_cache, meta, scale, out) -> None:
        for launch in self._prefill_launches(q, k_cache, v_cache, meta, scale, out):
            launch()

    def per_layer(self, q, k, v, meta, scale, out, k_cache, v_cache) -> PerLayerLaunches:
        """Decode and prefill launches built once per step; each layer issues them with its own cache."""
        num_decode = meta.num_decode_tokens
        decode = (self._decode_launches(q[:num_decode], k_cache, v_cache, meta, scale, out[:num_decode])
                  if num_decode else [])
        prefill = (self._prefill_launches(q[num_decode:], k_cache, v_cache, meta, scale, out[num_decode:])
                   if meta.num_prefill_seqs else [])
        if self.overlap_decode and decode and prefill:
            if self._side_stream is None:
                self._side_stream = torch.cuda.Stream(q.device)
            return OverlappedLaunches(decode, prefill, self._side_stream)
        return PerLayerLaunches(decode + prefill)

    def warm_up(self, k_cache, v_cache, num_heads: int, max_model_len: int, max_num_seqs: int,
                table_width: int) -> int:
        return kernels.warm_up(k_cache, v_cache, num_heads, max_model_len, max_num_seqs, table_width)

    @staticmethod
    def _decode_launches(q, k_cache, v_cache, meta, scale, out) -> list[Launch]:
        splits = meta.decode_splits
        return kernels.paged_decode_launches(q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens,
                                             scale, splits.num_splits, out, fill_splits=splits.fill_splits,
                                             long_seqs=meta.decode_long_seqs, row_order=meta.decode_row_order)

    @staticmethod
    def _prefill_launches(q, k_cache, v_cache, meta, scale, out) -> list[Launch]:
        return kernels.paged_prefill_launches(q, k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                                              meta.prefill_context_lens, meta.prefill_max_q_len, scale, out,
                                              num_splits=None, max_k_len=meta.prefill_max_k_len)
