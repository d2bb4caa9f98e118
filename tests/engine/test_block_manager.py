"""BlockManager: exact block ids, reference counts, prefix hits, eviction order, no leaks."""

from __future__ import annotations

import engine.core.block_manager as bm_module
from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

PARAMS = SamplingParams(max_tokens=4)


def make_seq(tokens: list[int], seq_id: int = 0) -> Sequence:
    return Sequence(seq_id, tokens, PARAMS)


def admit(bm: BlockManager, seq: Sequence) -> list[int]:
    hits = bm.find_cached_prefix(seq)
    assert bm.allocate(seq, hits, seq.num_tokens - len(hits) * bm.block_size)
    return hits


def test_fresh_allocation_takes_lowest_ids_and_counts_free_blocks():
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = make_seq(list(range(10)))
    assert admit(bm, seq) == []
    assert seq.block_table == [0, 1, 2]
    assert seq.num_computed_tokens == 0
    assert bm.num_free_blocks == 7 and bm.num_used_blocks == 3
    assert bm.ref_counts == [1, 1, 1]
    # Only the two full blocks are offered to the cache.
    assert bm.num_cached_blocks == 2 and seq.num_registered_blocks == 2


def test_prefix_hit_shares_blocks_and_caps_at_last_token():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = make_seq(list(range(10)), 0)
    admit(bm, first)
    second = make_seq(list(range(8)) + [99, 98, 97], 1)
    assert admit(bm, second) == [0, 1]
    assert second.block_table == [0, 1, 3]
    assert second.num_computed_tokens == 8
    assert bm.ref_counts == [2, 2, 1, 1]
    # Exactly two full blocks in the prompt: the last block is recomputed so one token is left to compute.
    third = make_seq(list(range(8)), 2)
    assert bm.find_cached_prefix(third) == [0]
    assert bm.num_queried_tokens == 10 + 11 and bm.num_hit_tokens == 8


def test_different_prefix_with_same_block_misses_because_hashes_chain():
    bm = BlockManager(num_blocks=10, block_size=4)
    admit(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], 0))
    other = make_seq([0, 0, 0, 0, 5, 6, 7, 8, 9], 1)  # second block equal, first differs
    assert bm.find_cached_prefix(other) == []


def test_free_keeps_cached_blocks_reusable_until_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(list(range(9)), 0)  # blocks 0,1 full, 2 partial
    admit(bm, a)
    bm.free(a)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 4
    assert bm.ref_counts == [0, 0, 0]
    # Re-admitting the same prompt hits both cached blocks, even though they were freed.
    a2 = make_seq(list(range(9)), 1)
    assert admit(bm, a2) == [0, 1]
    # The never-used block 3 goes first, then the freed uncached block 2.
    assert a2.block_table == [0, 1, 3]
    bm.free(a2)
    b = make_seq([50 + i for i in range(13)], 2)  # needs 4 blocks: evicts everything
    admit(bm, b)
    # Freed order: uncached 3 first, then 2 (uncached), then 1 (tail of the chain) before 0.
    assert b.block_table == [3, 2, 1, 0]
    assert bm.find_cached_prefix(make_seq(list(range(9)), 3)) == []


def test_eviction_prefers_least_recently_freed_cached_block():
    bm = BlockManager(num_blocks=3, block_size=2)
    x = make_seq([1, 2, 3], 0)
    y = make_seq([7, 8, 9], 1)
    admit(bm, x)  # blocks 0 (cached [1,2]) and 1
    assert x.block_table == [0, 1]
    assert not bm.allocate(y, [], 3)  # needs 2 blocks, 1 free
    assert y.block_table == []
    bm.free(x)  # 1 (uncached) to the head, 0 cached after it
    assert admit(bm, y) == []
    assert y.block_table == [2, 1]
    z = make_seq([5, 5, 5], 2)
    assert bm.find_cached_prefix(make_seq([1, 2, 3], 9)) == [0]
    assert not bm.allocate(z, [], 3)  # needs 2, only block 0 free
    bm.free(y)
    admit(bm, z)
    # Free queue was [0 (cached [1,2]), 1 (uncached, to the head), 2 (cached [7,8])] -> 1, then 0 (LRU).
    assert z.block_table == [1, 0]
    assert bm.find_cached_prefix(make_seq([1, 2, 3], 9)) == []
    assert bm.find_cached_prefix(make_seq([7, 8, 9], 9)) == [2]


def test_allocation_failure_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq(list(range(12)))
    assert not bm.allocate(seq, [], 12)
    assert seq.block_table == [] and bm.num_free_blocks == 2 and bm.num_used_blocks == 0


def test_revived_cached_blocks_count_against_free_space():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], 0)
    admit(bm, a)
    bm.free(a)
    b = make_seq([1, 2, 3, 4, 6, 7, 8], 1)
    hits = bm.find_cached_prefix(b)
    assert hits == [0, 1]
    # 2 revived + 2 new > 3 free blocks
    assert not bm.allocate(b, hits, 3)
    assert bm.num_free_blocks == 3 and bm.ref_counts == [0, 0, 0]


def test_append_slots_allocates_on_block_boundary_and_registers_full_blocks():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq([1, 2, 3])
    admit(bm, seq)
    assert seq.block_table == [0]
    seq.num_computed_tokens = 3
    seq.token_ids.append(4)  # the sampled token; its KV is computed next step
    assert bm.append_slots(seq, 1)
    assert seq.block_table == [0] and bm.num_cached_blocks == 1  # block 0 now full: registered
    seq.num_computed_tokens = 4
    seq.token_ids.append(5)
    assert bm.append_slots(seq, 1)
    assert seq.block_table == [0, 1]
    assert not bm.append_slots(seq, 20)  # would need 5 blocks in all
    assert seq.block_table == [0, 1]


def test_duplicate_content_is_not_registered_twice():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3], 0)
    b = make_seq([1, 2, 3], 1)
    # a registers its full block at allocation, so b, admitted right after, shares it.
    admit(bm, a)
    assert admit(bm, b) == [0]
    c = make_seq([9, 9, 9], 2)
    d = make_seq([9, 9, 9], 3)
    hits_c = bm.find_cached_prefix(c)
    hits_d = bm.find_cached_prefix(d)  # looked up before c is allocated: both miss
    assert bm.allocate(c, hits_c, 3) and bm.allocate(d, hits_d, 3)
    assert b.block_table == [0, 2]
    assert c.block_table == [3, 4] and d.block_table == [5, 6]
    assert bm.block_hashes[3] is not None and bm.block_hashes[5] is None
    bm.free(d)
    bm.free(c)
    bm.free(b)
    bm.free(a)
    assert bm.num_used_blocks == 0 and all(r == 0 for r in bm.ref_counts)


def test_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, data: 42)
    bm = BlockManager(num_blocks=8, block_size=2)
    admit(bm, make_seq([1, 2, 3], 0))
    other = make_seq([5, 6, 7], 1)
    assert bm.find_cached_prefix(other) == []


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    admit(bm, make_seq([1, 2, 3], 0))
    assert bm.find_cached_prefix(make_seq([1, 2, 3], 1)) == []
    assert bm.num_cached_blocks == 0 and bm.num_queried_tokens == 0


def test_unbounded_cache_costs_nothing_up_front():
    bm = BlockManager(num_blocks=10**9, block_size=16)
    assert bm.ref_counts == [] and bm.num_free_blocks == 10**9


def test_prefix_probe_counts_cached_leading_blocks_without_side_effects():
    from engine.core.block_manager import prefix_block_hashes

    bm = BlockManager(num_blocks=8, block_size=2)
    seq = make_seq([1, 2, 3, 4, 5], 0)
    admit(bm, seq)
    assert prefix_block_hashes([1, 2, 3, 4, 5], 2) == seq.block_hashes
    assert bm.num_cached_prefix_blocks(prefix_block_hashes([1, 2, 3, 4, 9, 9], 2)) == 2
    assert bm.num_cached_prefix_blocks(prefix_block_hashes([1, 2, 7, 7], 2)) == 1
    assert bm.num_cached_prefix_blocks(prefix_block_hashes([9, 9], 2)) == 0
    assert bm.ref_counts == [1, 1, 1] and bm.num_queried_tokens == 5


def test_a_failed_step_withdraws_only_the_blocks_it_would_have_computed():
    bm = BlockManager(num_blocks=10, block_size=4)
    first = make_seq(list(range(12)), 0)
    admit(bm, first)
    first.num_computed_tokens = 12  # its prefill ran: blocks 0, 1, 2 hold their tokens
    second = make_seq(list(range(8)) + [50, 51, 52, 53, 54, 55], 1)
    assert admit(bm, second) == [0, 1]  # 8 tokens hit; blocks 3 and 4 are fresh, 3 registered as full
    assert second.block_table == [0, 1, 3, 4] and second.num_registered_blocks == 3
    bm.forget_uncomputed(second)  # its step failed: block 3 was never written
    assert second.num_registered_blocks == 2 and bm.num_cached_blocks == 3  # blocks 0, 1, 2 stay cached
    third = make_seq(list(range(8)) + [50, 51, 52, 53, 60], 2)
    assert admit(bm, third) == [0, 1]  # no hit on block 3
    assert bm.ref_counts[:5] == [3, 3, 1, 1, 1]
