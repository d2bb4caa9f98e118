"""Session 36, probe B: the per-request and per-step paths made cheaper (simulator speed, issue 13), each checked
against what it replaced: the running list's rows found by bisection on ``Sequence.running_order``, finished
sequences removed one by one, a single filled block registered by its own path, the prefix walk's bytes converted
once, the step log's rows packed as bytes, the cost model's features read in one call, and the eos check of a step
whose rows all sampled one token."""

from __future__ import annotations

from array import array

from engine.core.block_manager import BlockManager, prefix_block_hashes, token_bytes
from engine.core.config import EngineConfig
from engine.core.records import StepLog
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import FINISHED, FinishReason, Sequence, index_in_running
from sim.batch_features import FEATURE_NAMES, batch_features


def _seq(seq_id: int, tokens, max_tokens: int = 50) -> Sequence:
    return Sequence(seq_id, array("i", tokens), SamplingParams(max_tokens=max_tokens))


def _scheduler(**options) -> Scheduler:
    config = EngineConfig(block_size=16, max_num_seqs=64, max_num_batched_tokens=4096, **options)
    return Scheduler(config.resolved(num_gpu_blocks=400, max_model_len=256), eos_token_ids=[99], lazy_tokens=True)


def test_running_rows_are_found_by_bisection_and_the_running_order_only_grows():
    scheduler = _scheduler()
    seqs = [_seq(i, [1, 2, 3, 10 + i]) for i in range(40)]
    for seq in seqs:
        scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule(0.0), [5] * 40, 1.0)
    assert [seq.running_order for seq in scheduler.running] == list(range(40))
    scheduler.drop_finished([])  # (nothing)
    # Three finish: the others keep their order and their positions are found by bisection.
    for seq in (seqs[3], seqs[17], seqs[30]):
        seq.status = FINISHED
    scheduler.drop_finished([seqs[3], seqs[17], seqs[30]])
    running = scheduler.running
    assert running == [seq for i, seq in enumerate(seqs) if i not in (3, 17, 30)]
    assert [index_in_running(running, seq) for seq in running] == list(range(37))
    # A running list edited by hand (out of order): each row is still found, by the row-by-row search.
    shuffled = running[::-1]
    assert [index_in_running(shuffled, seq) for seq in shuffled] == list(range(37))


def test_drop_finished_removes_up_to_sixteen_one_by_one_and_filters_more_as_before():
    for num_finished in (1, 3, 16, 17, 30):
        scheduler = _scheduler()
        seqs = [_seq(i, [1, 2, 3, 10 + i]) for i in range(40)]
        for seq in seqs:
            scheduler.add(seq)
        scheduler.postprocess(scheduler.schedule(0.0), [5] * 40, 1.0)
        gone = seqs[1:2 * num_finished:2][:num_finished]
        for seq in gone:
            seq.status = FINISHED
        scheduler.drop_finished(gone)
        assert scheduler.running == [seq for seq in seqs if seq not in gone]


def test_one_filled_block_is_registered_as_the_general_path_registers_it():
    tokens = list(range(1, 11))  # two full 4-token blocks and two tokens
    fast, slow = BlockManager(20, 4), BlockManager(20, 4)
    a, b = _seq(0, tokens), _seq(1, tokens)
    assert fast.allocate(a, [], 10) and slow.allocate(b, [], 10)
    assert a.num_registered_blocks == 2 and a.block_hashes == prefix_block_hashes(tokens, 4)
    a.num_computed_tokens = b.num_computed_tokens = 10  # the prompt computed
    for token in (11, 12):  # sampled, then computed: the third block fills with 12, registered alone
        a.token_ids.append(token)
        b.token_ids.append(token)
        assert fast.append_slots(a, 1)
        assert a.num_registered_blocks == (3 if token == 12 else 2)
        a.num_computed_tokens += 1
        b.num_computed_tokens += 1
    # The general path, for comparison: the block registered among several (none of them registered yet).
    b.num_registered_blocks = 0
    del b.block_hashes[:]
    slow._cached.clear()
    slow._register_full_blocks(b, 3)
    assert a.block_hashes == b.block_hashes == prefix_block_hashes(tokens + [11, 12], 4)
    assert fast._cached == {h: a.block_table[i] for i, h in enumerate(a.block_hashes)}
    assert fast._block_tokens[a.block_table[2]] == token_bytes([9, 10, 11, 12])
    assert a.num_registered_blocks == 3


def test_the_prefix_walk_hashes_each_block_once_and_stops_at_the_first_miss():
    bm = BlockManager(50, 4)
    first = _seq(0, list(range(1, 14)))  # three full blocks cached (the 13th token is left to compute)
    assert bm.allocate(first, bm.find_cached_prefix(first), 13)
    shared = list(range(1, 9)) + [70, 71, 72, 73, 74, 75, 76, 77, 78]  # two blocks shared, then others
    seq = _seq(1, shared)
    hits = bm.find_cached_prefix(seq)
    assert hits == first.block_table[:2]
    # Hashed up to the miss (the third block), not beyond: the same hashes as prefix_block_hashes.
    assert seq.block_hashes == prefix_block_hashes(shared, 4)[:3]
    # Asked again: the walk starts from known hashes and answers the same.
    assert bm.find_cached_prefix(seq) == hits and len(seq.block_hashes) == 3
    # A router's hashes (every full block) are taken as they are.
    routed = _seq(2, shared)
    routed.block_hashes = prefix_block_hashes(shared, 4)
    assert bm.find_cached_prefix(routed) == hits and len(routed.block_hashes) == 4


def test_a_recorded_step_is_packed_as_the_columns_hold_it():
    log = StepLog()
    batch = ScheduledBatch()
    batch.add(_seq(0, [1, 2, 3]), 3)
    batch.continues_batch = 0
    log.record(batch, 1.5, 0.25, 3, 2, 7, 1, True)
    values = [getattr(batch, name) for name in FEATURE_NAMES]
    assert list(log._ints) == [*values, 0, 3, 2, 7, 1, 1] and list(log._times) == [1.5, 0.25]
    assert batch_features(batch) == dict(zip(FEATURE_NAMES, values))


def test_a_step_whose_rows_all_sample_an_eos_token_finishes_them_all():
    scheduler = _scheduler()
    scheduler.min_steady_rows = 1
    seqs = [_seq(i, [1, 2, 3, 10 + i]) for i in range(20)]
    for seq in seqs:
        scheduler.add(seq)
    scheduler.postprocess(scheduler.schedule(0.0), [5] * 20, 1.0)
    scheduler.postprocess(scheduler.schedule(1.0), [5] * 20, 2.0)  # filed
    batch = scheduler.schedule(2.0)
    assert batch.special_rows is not None
    scheduler.postprocess(batch, [5] * 20, 3.0)  # a lazy step: owed
    batch = scheduler.schedule(3.0)
    finished = scheduler.postprocess(batch, [99] * 20, 4.0)  # every row the eos token
    assert finished == seqs and not scheduler.running
    assert all(seq.finish_reason is FinishReason.STOP and list(seq.token_ids[4:]) == [5, 5, 5, 99] for seq in seqs)
