"""Host-side launch heuristics for the Triton kernels (importable without triton)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.config import cdiv

DECODE_TILE_TOKENS = 64  # KV tokens per tile of the decode kernel (fewer when a page is smaller)
# At most this many long contexts per decode batch get extra splits. Real serving batches of 56-112 rows hold 9-22
# contexts over the cap (ShareGPT at ~70 % load, 2026-12-03): with 4 slots their decode attention took up to 19 %
# longer (median 8 %) than an equal-context batch of the same KV tokens (what the profile grid measures), with 8 no
# longer (-4 to +0.3 %); 16 helped one batch more and 32 cost more in padding (benchmarks/decode_real_batches.py;
# results in validation/results/machine-f-2026-12-03/decode-real-batches*.json).
LONG_SEQ_SLOTS = 8


@dataclass(frozen=True)
class DecodeSplits:
    """How split-KV decode cuts contexts; fixed per CUDA-graph bucket, so chosen from the batch size.

    Every sequence's context is cut into ``fill_splits`` ranges, enough programs to keep the GPU busy.
    Up to ``num_long_seqs`` sequences whose ranges would exceed ``cap_tiles`` tiles are cut into
    ``num_splits`` instead; their extra ranges are the launch's first programs. Without that, a long
    context in a large batch (``fill_splits`` 1) is one program that finishes long after the rest,
    and decode time follows the longest context instead of the KV bytes read. Only a few are
    helped: once several contexts are long, the work is balanced again.
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
    max_model_len: int,
    num_sms: int,
    cap_tiles: int = 32,
    max_long_splits: int = 8,
) -> DecodeSplits:
    """``fill_splits`` from ``decode_num_splits``; long sequences get enough splits that the longest allowed
    context needs at most ``cap_tiles`` per program, but no more than ``max_long_splits``."""
    max_tiles = cdiv(max_model_len, DECODE_TILE_TOKENS)
    fill = decode_num_splits(num_seqs, num_kv_heads, max_tiles, num_sms)
    wanted = min(max_long_splits, cdiv(max(1, max_tiles), cap_tiles))
    wanted = 1 << (wanted - 1).bit_length()  # a power of two: the merge kernel loads all splits at once
    if wanted <= fill:
        return DecodeSplits(fill, fill, cap_tiles, 0)
    return DecodeSplits(wanted, fill, cap_tiles, LONG_SEQ_SLOTS)


def long_decode_rows(context_lens, splits: DecodeSplits) -> list[int]:
    """The rows to give ``num_splits`` ranges: the longest contexts whose ``fill_splits`` ranges would
    exceed the cap, at most ``num_long_seqs``, in row order, padded with -1 to exactly that many slots."""
    slots = splits.num_long_seqs
    if not slots:
        return []
    context = np.asarray(context_lens)
    rows = np.flatnonzero(context > splits.fill_splits * splits.cap_tiles * DECODE_TILE_TOKENS)
    if len(rows) > slots:
        rows = np.sort(rows[np.argpartition(context[rows], -slots)[-slots:]])
    return rows.tolist() + [-1] * (slots - len(rows))


def decode_row_order(context_lens) -> np.ndarray:
    """The decode rows by context, longest first (ties in row order): the order the decode kernel starts their
    programs in, so that the longest ones do not start in its last wave and finish alone."""
    return np.argsort(-np.asarray(context_lens, dtype=np.int64), kind="stable")


def prefill_num_splits(num_programs: int, max_k_len: int, block_n: int, num_sms: int, max_splits: int = 16,
                       min_tiles_per_split: int = 8) -> int:
    """Key ranges per query tile for the paged prefill kernel: split (by powers of two) while fewer than two
    programs per multiprocessor are in flight and every range keeps at least ``min_tiles_per_split`` key
    tiles of the longest context. A short chunk on a long cached prefix (a new turn of a conversation)
    is a handful of query tiles, each reading the whole prefix: unsplit, it ran at a few percent of the
    memory bandwidth."""
    splits = 1
    tiles = cdiv(max(1, max_k_len), block_n)
    while (splits < max_splits and num_programs * splits < 2 * num_sms
           and tiles >= 2 * splits * min_tiles_per_split):
        splits *= 2
    return splits


def reachable_decode_splits(num_kv_heads: int, max_model_len: int, max_num_seqs: int,
                            num_sms: int) -> list[DecodeSplits]:
    """Every ``DecodeSplits`` a decode batch of 1 to ``max_num_seqs`` rows gets: each is a kernel variant.

    Only ``fill_splits`` depends on the batch size, and it is 1 from ``4 * num_sms / num_kv_heads`` rows on (a
    batch that large already has four programs per multiprocessor), so batches over ``4 * num_sms`` rows add no
    variant: looping up to ``max_num_seqs`` (the engine takes up to 2**31 - 1) stalled the warm-up."""
    last_distinct_rows = min(max_num_seqs, max(1, 4 * num_sms))
    found = {decode_splits(n, num_kv_heads, max_model_len, num_sms) for n in range(1, last_distinct_rows + 1)}
    return sorted(found, key=lambda s: (s.num_splits, s.fill_splits, s.num_long_seqs))


def reachable_prefill_splits(max_model_len: int, block_n: int, num_sms: int) -> list[int]:
    """Every ``prefill_num_splits`` choice for contexts up to ``max_model_len``: the powers of two up to what
    one program over the longest context gets (fewer programs and longer contexts only ever split more)."""
    most = prefill_num_splits(1, max_model_len, block_n, num_sms)
    return [1 << i for i in range(most.bit_length())]
