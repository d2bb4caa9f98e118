"""Host-side launch heuristics for the Triton kernels (importable without triton)."""

from __future__ import annotations


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_tiles: int, num_sms: int) -> int:
    """Split the KV sequence until about four programs per multiprocessor are in flight (at most one split per tile)."""
    splits = 1
    while num_seqs * num_kv_heads * splits < 4 * num_sms and splits * 2 <= max(1, max_tiles) and splits < 64:
        splits *= 2
    return splits
