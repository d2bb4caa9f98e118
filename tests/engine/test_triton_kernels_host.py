"""Split-KV decode launch heuristics (host side, no GPU needed)."""

from __future__ import annotations

from engine.attention.triton_kernels_host import DecodeSplits, decode_num_splits, decode_splits

SMS = 132  # H200


def test_fill_splits_keep_about_four_programs_per_multiprocessor():
    assert decode_num_splits(1, 8, 256, SMS) == 64
    assert decode_num_splits(16, 8, 256, SMS) == 8  # 16 * 8 * 4 = 512 < 528, so one more doubling
    assert decode_num_splits(66, 8, 256, SMS) == 1
    assert decode_num_splits(256, 8, 256, SMS) == 1
    assert decode_num_splits(4, 8, 1, SMS) == 1  # never more splits than tiles


def test_large_batches_get_capped_splits_for_long_contexts():
    # max_model_len 16384 -> 256 tiles of 64; a 32-tile cap needs 8 splits for the longest context.
    assert decode_splits(256, 8, 256, SMS) == DecodeSplits(num_splits=8, fill_splits=1, cap_tiles=32)
    # small batches already split widely: the cap adds nothing
    assert decode_splits(1, 8, 256, SMS) == DecodeSplits(num_splits=64, fill_splits=64, cap_tiles=32)
    # 65536-token contexts would need 32 splits; capped at 8 (a 64-tile range each)
    assert decode_splits(256, 8, 1024, SMS).num_splits == 8
    # short maximum lengths need no extra splits
    assert decode_splits(256, 8, 32, SMS) == DecodeSplits(num_splits=1, fill_splits=1, cap_tiles=32)
    # the split count is a power of two (the merge kernel loads them all in one block)
    assert decode_splits(256, 8, 65, SMS).num_splits == 4
