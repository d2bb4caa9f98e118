"""Host-side launch heuristics for the Triton kernels (importable without triton)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeSplits:
    """How split-KV decode cuts contexts; fixed per CUDA-graph bucket, so chosen from the batch size.

    Every sequence's context is cut into ``fill_splits`` ranges, enough programs to keep the GPU busy.
    Up to ``num_long_seqs`` sequences whose ranges would exceed ``cap_tiles`` tiles are cut into
    ``num_splits`` instead, by a second small launch. Without that, a long context in a large batch
    (``fill_splits`` 1) is one program that finishes long after the rest, and decode time follows the
    longest context instead of the KV bytes read. Only a few are helped: once several contexts are
    long, the work is balanced again.
    """

    num_splits: int
    fill_splits: int
    cap_tiles: int = 32
    num_long_seqs: int = 0


NO_SPLITS = DecodeSplits(1, 1)


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_tiles: int, num_sms: int) -> int:
    """Split the KV sequence until about four programs per multiprocessor are in flight (at most one split per tile)."""
    splits = 1
    while num_seqs * num_kv_heads * splits < 4 * num_sms and splits * 2 <= max(1, max_tiles) and splits < 64:
        splits *= 2
    return splits


def decode_splits(
    num_seqs: int,
    num_kv_heads: int,
    max_tiles: int,
    num_sms: int,
    cap_tiles: int = 32,
    max_long_splits: int = 8,
    num_long_seqs: int = 4,
) -> DecodeSplits:
    """``fill_splits`` from ``decode_num_splits``; long sequences get enough splits that the longest allowed
    context (``max_tiles``) needs at most ``cap_tiles`` per program, but no more than ``max_long_splits``."""
    fill = decode_num_splits(num_seqs, num_kv_heads, max_tiles, num_sms)
    wanted = min(max_long_splits, -(-max(1, max_tiles) // cap_tiles))
    wanted = 1 << (wanted - 1).bit_length()  # a power of two: the merge kernel loads all splits at once
    if wanted <= fill:
        return DecodeSplits(fill, fill, cap_tiles, 0)
    return DecodeSplits(wanted, fill, cap_tiles, num_long_seqs)


def long_decode_rows(context_lens: list[int], splits: DecodeSplits, tile_tokens: int = 64) -> list[int]:
    """The rows to give ``num_splits`` ranges: the longest contexts whose ``fill_splits`` ranges would
    exceed the cap, at most ``num_long_seqs``, padded with -1 to exactly that many slots."""
    slots = splits.num_long_seqs
    if not slots:
        return []
    threshold = splits.fill_splits * splits.cap_tiles * tile_tokens
    longest = heapq.nlargest(slots, ((c, i) for i, c in enumerate(context_lens) if c > threshold))
    rows = sorted(i for _, i in longest)
    return rows + [-1] * (slots - len(rows))
