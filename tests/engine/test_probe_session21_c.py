"""Engine defects from hostile-input probe session 21 (C); each test failed before its fix."""

from __future__ import annotations

import time

from engine.gpu.attention import triton_kernels_host
from engine.gpu.attention.triton_kernels_host import decode_splits, reachable_decode_splits


def _every_batch_size(num_kv_heads: int, max_model_len: int, max_num_seqs: int, num_sms: int):
    """The function as it was: one ``decode_splits`` per batch size (the reference for small limits)."""
    found = {decode_splits(n, num_kv_heads, max_model_len, num_sms) for n in range(1, max_num_seqs + 1)}
    return sorted(found, key=lambda s: (s.num_splits, s.fill_splits, s.num_long_seqs))


def test_reachable_decode_splits_match_every_batch_size_for_realistic_limits():
    for num_kv_heads in (1, 2, 8, 16):
        for max_model_len in (1, 64, 2048, 4096, 16384, 131072):
            for num_sms in (1, 4, 20, 132):
                for max_num_seqs in (0, 1, 2, 3, 7, 16, 31, 64, 129, 256, 600):
                    assert reachable_decode_splits(num_kv_heads, max_model_len, max_num_seqs, num_sms) == \
                        _every_batch_size(num_kv_heads, max_model_len, max_num_seqs, num_sms)


def test_reachable_decode_splits_cost_does_not_grow_with_max_num_seqs(monkeypatch):
    """The engine accepts max_num_seqs up to 2**31 - 1: one ``decode_splits`` per batch size stalled the warm-up.
    Calls are counted (and cut short) so that the old loop fails at once instead of running for hours."""
    calls = 0

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls > 10_000:
            raise AssertionError("reachable_decode_splits called decode_splits once per batch size")
        return decode_splits(*args, **kwargs)

    monkeypatch.setattr(triton_kernels_host, "decode_splits", counted)
    start = time.perf_counter()
    huge = reachable_decode_splits(8, 4096, 2**31 - 1, 132)
    assert time.perf_counter() - start < 1.0
    assert huge == _every_batch_size(8, 4096, 4 * 132 + 1, 132)
