"""BlockManager: exact block ids, reference counts, prefix hits, eviction order, no leaks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

import engine.core.block_manager as bm_module
from engine.core.block_manager import BlockManager, prefix_block_hashes, token_bytes
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


def test_block_hashes_chain_through_the_seed():
    """Each full block's hash is xxh3-64 of its int32 tokens seeded with its parent's hash (the first block's parent is
    ROOT_HASH, 0): the values are pinned (native int32 tokens, a little-endian host), and a sequence's registered
    blocks get the same ones."""
    tokens = list(range(8))
    first, second = prefix_block_hashes(tokens, 4)
    assert (first, second) == (11660027832386793900, 2615516339191896381)
    assert first == xxh3_64_intdigest(token_bytes(tokens[:4]), bm_module.ROOT_HASH) == bm_module.hash_block(
        bm_module.ROOT_HASH, token_bytes(tokens[:4]))
    assert second == xxh3_64_intdigest(token_bytes(tokens[4:]), first) == bm_module.hash_block(
        first, token_bytes(tokens[4:]))
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(tokens + [8])
    admit(bm, seq)
    assert seq.block_hashes == [first, second] and bm.block_hashes[:2] == [first, second]


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    admit(bm, make_seq([1, 2, 3], 0))
    assert bm.find_cached_prefix(make_seq([1, 2, 3], 1)) == []
    assert bm.num_cached_blocks == 0 and bm.num_queried_tokens == 0


def test_unbounded_cache_costs_nothing_up_front():
    bm = BlockManager(num_blocks=10**9, block_size=16)
    assert bm.ref_counts == [] and bm.num_free_blocks == 10**9


def test_prefix_probe_counts_cached_leading_blocks_without_side_effects():
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


def test_a_head_asked_again_sees_evictions_and_new_blocks_of_its_prefix():
    # The waiting head that did not fit is asked for its prefix every step; the answer must follow the cache as a
    # fresh walk would: shorter when one of its blocks was evicted, longer when a later block was registered.
    bm = BlockManager(num_blocks=6, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], 0)
    admit(bm, a)  # blocks 0 [1,2], 1 [3,4] cached; 2 partial
    head = make_seq([1, 2, 3, 4, 5, 6, 7], 1)
    assert bm.find_cached_prefix(head) == [0, 1]
    a.num_computed_tokens = 5
    a.token_ids.append(6)
    assert bm.append_slots(a, 1)  # block 2 now [5,6]: registered, so the head's third block hits
    assert bm.find_cached_prefix(head) == [0, 1, 2]
    bm.free(a)  # free queue: 2, 1, 0 (tail first); nothing never-used is left after 3 more blocks
    filler = make_seq([9] * 7, 2)
    assert bm.allocate(filler, [], 7)  # 4 blocks: 3, 4, 5 never used, then 2 evicted
    assert filler.block_table == [3, 4, 5, 2]
    assert bm.find_cached_prefix(head) == [0, 1]
    bm.free(filler)  # 2 (uncached now) to the head of the queue, then 5, 4, 3
    again = make_seq([1, 2, 3, 4, 5, 6, 7, 8], 3)
    assert admit(bm, again) == [0, 1]
    assert again.block_table == [0, 1, 2, 5]  # block 2 holds [5,6] again, registered anew
    assert bm.find_cached_prefix(head) == [0, 1, 2]
    bm.free(again)
    evict_all = make_seq([8] * 12, 4)
    assert bm.allocate(evict_all, [], 12)
    assert bm.find_cached_prefix(head) == []


def test_a_hit_list_handed_out_is_the_callers_to_keep():
    bm = BlockManager(num_blocks=8, block_size=2)
    admit(bm, make_seq([1, 2, 3, 4, 5], 0))
    head = make_seq([1, 2, 3, 4, 5, 6], 1)
    hits = bm.find_cached_prefix(head)
    hits.append(7)  # a caller editing its list does not change the next answer
    assert bm.find_cached_prefix(head) == [0, 1]


def test_a_hash_collision_after_eviction_is_caught_on_a_repeated_ask(monkeypatch):
    # Every block hashes alike: only the token comparison tells contents apart, also for an answer found earlier.
    monkeypatch.setattr(bm_module, "hash_block", lambda parent, data: 42)
    bm = BlockManager(num_blocks=2, block_size=2)
    a = make_seq([1, 2, 3], 0)
    admit(bm, a)  # block 0 [1,2] cached
    head = make_seq([1, 2, 3, 9], 1)
    assert bm.find_cached_prefix(head) == [0]
    bm.free(a)  # free queue: 1 (uncached) first, then 0
    assert bm.allocate(make_seq([7], 2), [], 1)  # takes 1
    b = make_seq([5, 6], 3)
    assert bm.allocate(b, [], 2)  # evicts 0 and registers [5,6] there under the same hash
    assert b.block_table == [0] and bm.block_hashes[0] == 42
    assert bm.find_cached_prefix(head) == []


def _fresh_prefix_walk(bm: BlockManager, seq: Sequence) -> list[int]:
    """What find_cached_prefix answers with nothing remembered: the cache walked from the first block."""
    hits = []
    for index, block_hash in enumerate(prefix_block_hashes(seq.token_ids, bm.block_size)[: (seq.num_tokens - 1)
                                                                                        // bm.block_size]):
        block_id = bm._cached.get(block_hash)
        start = index * bm.block_size
        if block_id is None or bm._block_tokens[block_id] != token_bytes(seq.token_ids[start : start + bm.block_size]):
            break
        hits.append(block_id)
    return hits


@settings(max_examples=60, deadline=None)
@given(
    heads=st.lists(st.lists(st.integers(0, 2), min_size=3, max_size=14), min_size=1, max_size=3),
    rng=st.randoms(use_true_random=False),
)
def test_a_head_asked_every_step_gets_what_a_fresh_walk_finds(heads, rng):
    # 200 random operations on a tiny cache, so that blocks are evicted, revived and registered anew all the time;
    # the current head is asked after every one, as a waiting head that does not fit is asked every step. Prompts
    # are cut from the heads, so that the heads hit.
    bm = BlockManager(num_blocks=5, block_size=2)
    running: list[Sequence] = []
    head_seqs = [make_seq(tokens, 100 + i) for i, tokens in enumerate(heads)]
    head = head_seqs[0]
    for step in range(200):
        op = rng.choice(["admit", "free", "decode", "decode", "forget", "next_head"])
        if op == "admit":
            source = rng.choice(head_seqs).token_ids
            seq = make_seq(source[: rng.randint(1, len(source))] + [rng.randint(0, 2)] * rng.randint(0, 2), step)
            hits = bm.find_cached_prefix(seq)
            if bm.allocate(seq, hits, seq.num_tokens - len(hits) * bm.block_size):
                seq.num_computed_tokens = seq.num_tokens
                running.append(seq)
        elif op == "free" and running:
            bm.free(running.pop(rng.randrange(len(running))))
        elif op == "decode" and running:
            seq = rng.choice(running)
            seq.token_ids.append(rng.randint(0, 2))
            if bm.append_slots(seq, 1):
                seq.num_computed_tokens += 1
            else:
                seq.token_ids.pop()
        elif op == "forget" and running:  # a failed step: some tokens not computed after all, then freed
            seq = running.pop(rng.randrange(len(running)))
            seq.num_computed_tokens -= min(rng.randint(0, 4), seq.num_computed_tokens)
            bm.forget_uncomputed(seq)
            bm.free(seq)
        elif op == "next_head":
            head = rng.choice(head_seqs)
        assert bm.find_cached_prefix(head) == _fresh_prefix_walk(bm, head)
        # The counts kept as blocks move agree with the blocks: referenced ones, and the never-used plus freed ones.
        assert bm.num_used_blocks == sum(count > 0 for count in bm.ref_counts) == bm._num_ever_used - len(bm._free)
        assert bm.num_free_blocks == bm.num_blocks - bm.num_used_blocks
