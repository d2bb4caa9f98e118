"""Split-KV decode launch heuristics (host side, no GPU needed)."""

from __future__ import annotations

import numpy as np

from engine.gpu.attention.triton_kernels_host import (
    DecodeSplits,
    decode_num_splits,
    decode_row_order,
    decode_splits,
    long_decode_rows,
    prefill_num_splits,
    reachable_decode_splits,
    reachable_prefill_splits,
)

SMS = 132  # H200


def test_fill_splits_keep_about_four_programs_per_multiprocessor():
    assert decode_num_splits(1, 8, 256, SMS) == 64
    assert decode_num_splits(16, 8, 256, SMS) == 8  # 16 * 8 * 4 = 512 < 528, so one more doubling
    assert decode_num_splits(66, 8, 256, SMS) == 1
    assert decode_num_splits(256, 8, 256, SMS) == 1
    assert decode_num_splits(4, 8, 1, SMS) == 1  # never more splits than tiles


def test_large_batches_split_their_long_contexts_further():
    # max_model_len 16384 = 256 tiles of 64; a 32-tile cap needs 8 splits for the longest context.
    assert decode_splits(256, 8, 16384, SMS) == DecodeSplits(num_splits=8, fill_splits=1, cap_tiles=32, num_long_seqs=8)
    assert decode_splits(32, 8, 16384, SMS) == DecodeSplits(num_splits=8, fill_splits=4, cap_tiles=32, num_long_seqs=8)
    # small batches already split widely: no second launch
    assert decode_splits(1, 8, 16384, SMS) == DecodeSplits(num_splits=64, fill_splits=64, cap_tiles=32, num_long_seqs=0)
    # 65536-token contexts would need 32 splits; capped at 8 (a 128-tile range each)
    assert decode_splits(256, 8, 65536, SMS).num_splits == 8
    # short maximum lengths need no extra splits
    assert decode_splits(256, 8, 2048, SMS) == DecodeSplits(num_splits=1, fill_splits=1, cap_tiles=32, num_long_seqs=0)
    # the split count is a power of two (the merge kernel loads them all in one block)
    assert decode_splits(256, 8, 65 * 64, SMS).num_splits == 4


def test_long_rows_are_the_longest_contexts_over_the_cap_in_row_order():
    splits = DecodeSplits(num_splits=8, fill_splits=1, cap_tiles=32, num_long_seqs=4)  # cap: 2048 tokens
    contexts = [100, 5000, 2048, 2049, 16000, 300, 9000, 7000, 3000]
    assert long_decode_rows(contexts, splits) == [1, 4, 6, 7]  # 3000 and 2049 lose to four longer ones
    assert long_decode_rows([100, 2049, 50], splits) == [1, -1, -1, -1]
    assert long_decode_rows([100, 2048], splits) == [-1, -1, -1, -1]  # exactly the cap: one range suffices
    wide = DecodeSplits(num_splits=8, fill_splits=4, cap_tiles=32, num_long_seqs=4)  # cap: 4 x 2048 tokens
    assert long_decode_rows([8192, 8193], wide) == [1, -1, -1, -1]
    assert long_decode_rows([5000], DecodeSplits(8, 8)) == []
    # numpy input, as the CUDA-graph path passes it
    assert long_decode_rows(np.array(contexts, dtype=np.int64), splits) == [1, 4, 6, 7]


def test_decode_rows_start_longest_context_first_ties_in_row_order():
    assert decode_row_order([100, 5000, 0, 2048, 5000, 7]).tolist() == [1, 4, 3, 0, 5, 2]
    # the CUDA-graph path: padding rows (context 0) after every real row
    assert decode_row_order(np.array([3, 9, 0, 0], dtype=np.int64)).tolist() == [1, 0, 2, 3]
    assert decode_row_order([]).tolist() == []


def test_prefill_splits_only_short_chunks_over_long_prefixes():
    from engine.gpu.attention.triton_kernels_host import prefill_num_splits

    sms, block_n = 132, 64
    # One 64-token chunk (1 query tile x 8 head groups) over a 16k prefix: split until ~2 programs per SM.
    assert prefill_num_splits(8, 16384 + 64, block_n, sms) == 16
    assert prefill_num_splits(8 * 16, 16384 + 1024, block_n, sms) == 4  # 1,024 tokens: 128 programs x 4 >= 264
    # Enough programs already, or too few key tiles to share out: unsplit.
    assert prefill_num_splits(4 * 8 * 32, 2048, block_n, sms) == 1
    assert prefill_num_splits(8, 512, block_n, sms) == 1  # 8 key tiles: a range keeps at least 8
    assert prefill_num_splits(8, 1024, block_n, sms) == 2


def test_the_warm_up_covers_every_decode_variant_of_a_deployment():
    """qwen3-0.6b on an H200 (8 KV heads, 4k context, 256 sequences): fills of 64 down to 1, and the one
    variant where large batches give long contexts two ranges."""
    assert reachable_decode_splits(8, 4096, 256, SMS) == [
        DecodeSplits(2, 1, 32, 8), *(DecodeSplits(s, s, 32, 0) for s in (2, 4, 8, 16, 32, 64))]
    assert reachable_decode_splits(8, 4096, 1, SMS) == [DecodeSplits(64, 64, 32, 0)]


def test_the_warm_up_covers_every_prefill_split_count_any_step_can_choose():
    for max_model_len, block_n in ((512, 64), (4096, 64), (40960, 64), (40960, 16)):
        reachable = reachable_prefill_splits(max_model_len, block_n, SMS)
        chosen = {prefill_num_splits(programs, max_k_len, block_n, SMS)
                  for programs in range(1, 3 * SMS, 7) for max_k_len in range(1, max_model_len + 1, 97)}
        assert chosen == set(reachable), (max_model_len, block_n)
    assert reachable_prefill_splits(512, 64, SMS) == [1]
    assert reachable_prefill_splits(40960, 64, SMS) == [1, 2, 4, 8, 16]
