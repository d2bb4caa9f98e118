"""The prefix memo is kept only for a sequence allocate could not admit; the block counts are kept as blocks move."""

from engine.core.block_manager import BlockManager
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

PARAMS = SamplingParams(max_tokens=4)


def test_hits_are_remembered_only_when_allocate_cannot_admit_with_them() -> None:
    bm = BlockManager(num_blocks=8, block_size=2)
    assert bm.allocate(Sequence(0, [1, 2, 3, 4, 9], PARAMS), [], 5)  # blocks 0, 1 registered, 2 holds the 9
    seq = Sequence(1, [1, 2, 3, 4] + [5] * 11, PARAMS)
    hits = bm.find_cached_prefix(seq)
    assert hits == [0, 1] and bm._prefix_memo is None
    assert not bm.allocate(seq, hits, 11)  # 6 more blocks wanted, 5 free
    assert bm._prefix_memo == (seq, 7, [0, 1], [bm._block_tokens[0], bm._block_tokens[1]], 0)
    assert bm.find_cached_prefix(seq) == [0, 1]  # answered from the memo, kept up to date
    assert bm._prefix_memo[0] is seq
    admitted = Sequence(2, [1, 2, 3, 4, 6], PARAMS)
    hits = bm.find_cached_prefix(admitted)
    assert bm.allocate(admitted, hits, 1)
    assert hits == [0, 1] and bm._prefix_memo is None  # admitted at once: nothing kept


def test_used_and_free_counts_follow_takes_revivals_and_frees() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    first = Sequence(0, [1, 2, 3, 4, 5], PARAMS)
    assert bm.allocate(first, [], 5)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (3, 3)
    bm.free(first)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 6)
    again = Sequence(1, [1, 2, 3, 4, 7, 8, 9], PARAMS)
    hits = bm.find_cached_prefix(again)
    assert hits == [0, 1] and bm.allocate(again, hits, 3)  # two blocks revived from the free queue, two taken
    assert (bm.num_used_blocks, bm.num_free_blocks) == (4, 2)
    again.num_computed_tokens = 7  # its step ran
    assert bm.append_slots(again, 2)  # tokens 8 and 9: one more block
    assert (bm.num_used_blocks, bm.num_free_blocks) == (5, 1)
    bm.free(again)
    assert (bm.num_used_blocks, bm.num_free_blocks) == (0, 6)
