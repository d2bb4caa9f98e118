"""The block manager's admission paths (session 33, helper A): blocks whose hashes a sequence already holds (a
router's, or its own from the prefix-cache lookup) and blocks hashed at registration give the same cache, whether a
prompt is admitted whole or in chunks, under eviction."""

from __future__ import annotations

import random

import pytest

from engine.core.block_manager import BlockManager, prefix_block_hashes
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FINISHED, LENGTH, REJECTED, RUNNING, WAITING, FinishReason, Sequence, SequenceStatus

PARAMS = SamplingParams(max_tokens=4)


def _state(bm: BlockManager) -> tuple:
    return (dict(bm._cached), list(bm.block_hashes), list(bm._block_tokens), list(bm.ref_counts), list(bm._free),
            bm.num_queried_tokens, bm.num_hit_tokens, bm._num_uncached)


def _run(prompts: list[list[int]], block_size: int, hashed_ahead: bool, chunk: int, seed: int) -> list:
    """Admit each prompt (``chunk`` tokens a step, the rest through append_slots), decode a few tokens, free some;
    the manager's whole state after each request."""
    rng = random.Random(seed)
    bm = BlockManager(num_blocks=24, block_size=block_size)
    live: list[Sequence] = []
    states = []
    for seq_id, prompt in enumerate(prompts):
        seq = Sequence(seq_id, prompt, PARAMS)
        if hashed_ahead:  # as LLMEngine.add_request takes a prefix router's hashes
            seq.block_hashes = prefix_block_hashes(prompt, block_size)
        hits = bm.find_cached_prefix(seq)
        num_new = min(seq.num_tokens - len(hits) * block_size, chunk)
        while not bm.allocate(seq, hits, num_new):
            bm.free(live.pop(0))
            hits = bm.find_cached_prefix(seq)
            num_new = min(seq.num_tokens - len(hits) * block_size, chunk)
        seq.num_computed_tokens += num_new
        while seq.num_computed_tokens < seq.num_tokens:  # the prompt's other chunks
            num_new = min(seq.num_tokens - seq.num_computed_tokens, chunk)
            while not bm.append_slots(seq, num_new):
                bm.free(live.pop(0))
            seq.num_computed_tokens += num_new
        for _ in range(rng.randrange(0, 2 * block_size)):  # decode tokens, filling and registering blocks
            seq.token_ids.append(rng.randrange(0, 5))
            while not bm.append_slots(seq, 1):
                bm.free(live.pop(0))
            seq.num_computed_tokens += 1
        live.append(seq)
        if rng.random() < 0.4:
            bm.free(live.pop(rng.randrange(len(live))))
        states.append((_state(bm), [s.block_table[:] for s in live], [s.block_hashes[:] for s in live]))
    return states


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_size", [1, 2, 4])
def test_hashes_known_ahead_register_as_hashes_made_at_admission(seed, block_size) -> None:
    rng = random.Random(seed)
    stems = [[rng.randrange(0, 3) for _ in range(rng.randrange(0, 12))] for _ in range(4)]
    prompts = [rng.choice(stems) + [rng.randrange(0, 3) for _ in range(rng.randrange(1, 10))] for _ in range(40)]
    for chunk in (1, 3, 1000):
        assert _run(prompts, block_size, True, chunk, seed) == _run(prompts, block_size, False, chunk, seed)


def test_a_miss_from_the_first_block_is_not_remembered_and_asked_again_answers_alike() -> None:
    bm = BlockManager(num_blocks=8, block_size=2)
    seq = Sequence(0, [1, 2, 3, 4, 5], PARAMS)
    assert bm.find_cached_prefix(seq) == [] and bm._prefix_memo is None
    other = Sequence(1, [1, 2, 3, 4, 9], PARAMS)
    assert bm.allocate(other, [], 5)
    assert bm.find_cached_prefix(seq) == [0, 1]  # registered since: found on the next ask
    assert bm._prefix_memo is None  # remembered only once allocate could not admit seq with them


def test_the_module_constants_are_the_members() -> None:
    assert (WAITING, RUNNING, FINISHED) == (SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.FINISHED)
    assert (LENGTH, REJECTED) == (FinishReason.LENGTH, FinishReason.REJECTED)
