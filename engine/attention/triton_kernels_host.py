"""Host-side launch heuristics for the Triton kernels (importable without triton)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeSplits:
    """How split-KV decode cuts each sequence's context (fixed per CUDA-graph bucket, so per batch size).

    A sequence uses ``fill_splits`` programs per KV head, enough to keep the GPU busy; where one of
    those would read more than ``cap_tiles`` tiles it uses more, up to ``num_splits``. Without the cap
    a long context in a large batch (``fill_splits`` 1) is one program that finishes long after the
    rest: decode time would follow the longest context instead of the KV bytes read.
    """

    num_splits: int
    fill_splits: int
    cap_tiles: int


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_tiles: int, num_sms: int) -> int:
    """Split the KV sequence until about four programs per multiprocessor are in flight (at most one split per tile)."""
    splits = 1
    while num_seqs * num_kv_heads * splits < 4 * num_sms and splits * 2 <= max(1, max_tiles) and splits < 64:
        splits *= 2
    return splits


def decode_splits(
    num_seqs: int, num_kv_heads: int, max_tiles: int, num_sms: int, cap_tiles: int = 32, max_cap_splits: int = 8
) -> DecodeSplits:
    """``fill_splits`` from ``decode_num_splits``; enough further splits that the longest allowed context
    (``max_tiles``) needs at most ``cap_tiles`` per program, but no more than ``max_cap_splits``."""
    fill = decode_num_splits(num_seqs, num_kv_heads, max_tiles, num_sms)
    capped = min(max_cap_splits, -(-max(1, max_tiles) // cap_tiles))
    capped = 1 << (capped - 1).bit_length()  # a power of two: the merge kernel loads all splits at once
    return DecodeSplits(num_splits=max(fill, capped), fill_splits=fill, cap_tiles=cap_tiles)
