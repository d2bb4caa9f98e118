"""Scheduler: both policies, budgets, chunked prefill, preemption, rejection, stop rules."""

from __future__ import annotations

from engine.core.sequence import FinishReason, SequenceStatus
from tests.engine.helpers import make_engine, params, run_to_completion


def prompt(n: int, base: int = 100) -> list[int]:
    return [base + i for i in range(n)]


def test_mixed_chunks_long_prompt_and_decodes_alongside():
    engine, runner = make_engine(max_num_batched_tokens=8)
    a = engine.add_request(prompt(5), params(3))
    b = engine.add_request(prompt(10, 500), params(2))
    engine.step()
    # a's whole prompt (5) then a 3-token chunk of b.
    assert runner.batches[-1] == [(0, 5), (1, 3)]
    assert a.num_completion_tokens == 1 and b.num_completion_tokens == 0
    assert b.num_computed_tokens == 3
    engine.step()
    # a decodes (1), b continues with the 7 remaining prompt tokens: first token for b.
    assert runner.batches[-1] == [(0, 1), (1, 7)]
    assert b.num_completion_tokens == 1 and b.first_token_s == engine.clock.now()
    engine.step()
    assert runner.batches[-1] == [(0, 1), (1, 1)]
    assert a.is_finished and a.finish_reason is FinishReason.LENGTH and a.num_completion_tokens == 3
    assert b.is_finished and b.num_completion_tokens == 2
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_mixed_respects_max_num_seqs():
    engine, runner = make_engine(max_num_seqs=2)
    for i in range(3):
        engine.add_request(prompt(3, 100 * (i + 1)), params(2))
    engine.step()
    assert [sid for sid, _ in runner.batches[-1]] == [0, 1]
    engine.step()
    assert runner.batches[-1] == [(0, 1), (1, 1)]
    engine.step()  # 0 and 1 finished last step; 2 admitted now
    assert runner.batches[-1] == [(2, 3)]


def test_nano_step_is_all_prefill_or_all_decode():
    engine, runner = make_engine(policy="nano", max_num_batched_tokens=8)
    engine.add_request(prompt(5), params(3))
    engine.add_request(prompt(4, 300), params(3))
    engine.step()
    assert runner.batches[-1] == [(0, 5)]  # second prompt does not fit beside the first: no chunking
    engine.step()
    assert runner.batches[-1] == [(1, 4)]  # a waiting prompt fits: prefill step, 0 does not decode
    engine.step()
    assert runner.batches[-1] == [(0, 1), (1, 1)]


def test_nano_rejects_prompt_longer_than_token_budget():
    engine, _ = make_engine(policy="nano", max_num_batched_tokens=8)
    seq = engine.add_request(prompt(9), params())
    assert seq.finish_reason is FinishReason.REJECTED
    assert "max_num_batched_tokens=8" in seq.reject_reason and "nano" in seq.reject_reason


def test_rejections_name_the_limit_and_do_not_block_others():
    engine, runner = make_engine(num_gpu_blocks=4, max_model_len=20)
    too_long = engine.add_request(prompt(21), params())
    too_big = engine.add_request(prompt(17), params())  # 5 blocks of 4 > 4 blocks (max_model_len allows it)
    fine = engine.add_request(prompt(3), params(2))
    assert too_long.finish_reason is FinishReason.REJECTED and "max_model_len=20" in too_long.reject_reason
    assert too_big.finish_reason is FinishReason.REJECTED and "5 KV blocks" in too_big.reject_reason
    assert too_long.finish_s == 0.0
    run_to_completion(engine)
    assert fine.finish_reason is FinishReason.LENGTH and fine.num_completion_tokens == 2


def test_sequence_stops_at_kv_capacity_instead_of_stalling():
    engine, _ = make_engine(num_gpu_blocks=2, max_model_len=100)  # 8 tokens of KV in all
    seq = engine.add_request(prompt(6), params(50))
    run_to_completion(engine)
    assert seq.finish_reason is FinishReason.KV_CAPACITY and seq.num_tokens == 8  # cut, and says so


def test_cut_outputs_say_which_limit_cut_them():
    engine, _ = make_engine(num_gpu_blocks=64, max_model_len=10, max_num_batched_tokens=64)
    cut = engine.add_request(prompt(6), params(50))
    whole = engine.add_request(prompt(6, 300), params(4))  # prompt + max_tokens == max_model_len: not cut
    run_to_completion(engine)
    assert (cut.finish_reason, cut.num_tokens) == (FinishReason.MAX_MODEL_LEN, 10)
    assert (whole.finish_reason, whole.num_completion_tokens) == (FinishReason.LENGTH, 4)
    assert cut.finish_reason.is_cut and cut.finish_reason.served and not whole.finish_reason.is_cut
    # A prompt of max_model_len tokens gets the one token its prefill samples: asking for just that is no cut.
    full, _ = make_engine(num_gpu_blocks=64, max_model_len=10, max_num_batched_tokens=64)
    one = full.add_request(prompt(10), params(1))
    two = full.add_request(prompt(10, 300), params(2))
    run_to_completion(full)
    assert (one.finish_reason, one.num_completion_tokens) == (FinishReason.LENGTH, 1)
    assert (two.finish_reason, two.num_completion_tokens) == (FinishReason.MAX_MODEL_LEN, 1)
    nano, _ = make_engine(policy="nano", num_gpu_blocks=64, max_model_len=100, max_num_batched_tokens=12)
    budget_cut = nano.add_request(prompt(6), params(50))
    run_to_completion(nano)
    assert (budget_cut.finish_reason, budget_cut.num_tokens) == (FinishReason.TOKEN_BUDGET, 12)


def test_stop_rules_eos_ignore_eos_and_stop_tokens():
    engine, _ = make_engine(token_id=2, eos_token_ids=(2,))
    stops = engine.add_request(prompt(3), params(5, ignore_eos=False))
    ignores = engine.add_request(prompt(3, 300), params(5, ignore_eos=True))
    run_to_completion(engine)
    assert stops.finish_reason is FinishReason.STOP and stops.completion_token_ids == [2]
    assert ignores.finish_reason is FinishReason.LENGTH and ignores.num_completion_tokens == 5


def test_preemption_frees_newest_and_recomputes_it():
    # 6 blocks of 4 tokens. Two sequences of 8-token prompts take 2 blocks each; decoding grows them.
    engine, runner = make_engine(num_gpu_blocks=6, max_model_len=64)
    a = engine.add_request(prompt(8), params(8))
    b = engine.add_request(prompt(8, 300), params(8))
    engine.step()  # both prefill 8 tokens: 4 blocks; each samples its 9th token
    assert runner.batches[-1] == [(0, 8), (1, 8)]
    engine.step()  # both compute token 9: a 3rd block each, 6 in all
    assert runner.batches[-1] == [(0, 1), (1, 1)]
    for _ in range(3):  # tokens 10..12 fit in the 3rd blocks
        engine.step()
    assert not engine.scheduler.waiting
    engine.step()  # token 13 needs a 4th block: none free, so b (the newest) is preempted for a
    assert engine.scheduler.waiting[0] is b
    assert b.num_preemptions == 1 and b.status is SequenceStatus.WAITING and b.block_table == []
    assert runner.batches[-1] == [(0, 1)]
    run_to_completion(engine)
    assert a.num_completion_tokens == 8 and b.num_completion_tokens == 8
    assert b.num_preemptions >= 1
    assert engine.scheduler.block_manager.num_used_blocks == 0
    # On return b recomputes its 13 tokens (prompt and generated), less what its own blocks left in the cache.
    recompute = [n for batch in runner.batches for sid, n in batch if sid == 1 and n > 1]
    assert recompute[0] == 8
    assert recompute[1] + engine.scheduler.block_manager.num_hit_tokens == 13


def test_preempted_request_hits_its_own_cached_blocks_on_return():
    engine, _ = make_engine(num_gpu_blocks=6, max_model_len=64)
    engine.add_request(prompt(8), params(8))
    b = engine.add_request(prompt(8, 300), params(8))
    run_to_completion(engine)
    assert b.num_preemptions >= 1
    assert b.num_cached_tokens == 0  # cached tokens are counted at first admission only
    assert engine.scheduler.block_manager.num_hit_tokens > 0


def test_prefix_cache_hit_counts_at_first_admission():
    engine, runner = make_engine()
    first = engine.add_request(prompt(10), params(1))
    run_to_completion(engine)
    second = engine.add_request(prompt(10), params(1))
    engine.step()
    assert runner.batches[-1] == [(1, 2)]  # 8 tokens (2 blocks) from the cache, 2 computed
    assert second.num_cached_tokens == 8 and first.num_cached_tokens == 0


def test_abort_frees_blocks():
    engine, _ = make_engine()
    a = engine.add_request(prompt(6), params(10))
    engine.step()
    engine.abort_request(a)
    assert a.finish_reason is FinishReason.ABORTED
    assert engine.scheduler.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished_requests()


def test_step_log_records_each_step():
    engine, _ = make_engine(max_num_batched_tokens=8)
    engine.add_request(prompt(5), params(2))
    engine.add_request(prompt(10, 500), params(2))
    run_to_completion(engine)
    table = engine.step_log.to_arrow().to_pydict()
    assert table["num_prefill_tokens"] == [8, 7, 0]
    assert table["num_decode_seqs"] == [0, 1, 1]
    assert table["num_finished"] == [0, 1, 1]
    assert table["start_s"] == [0.0, 0.01, 0.02]


def test_continues_batch_marks_decode_steps_that_repeat_the_batch_before():
    engine, _ = make_engine(max_num_batched_tokens=16)
    engine.add_request(prompt(5), params(5))
    engine.add_request(prompt(3, 300), params(2))
    flags = []
    while engine.has_unfinished_requests():
        batch, _ = engine.step()
        flags.append(batch.continues_batch)
        if len(flags) == 4:
            engine.add_request(prompt(2, 600), params(3))
    # Both prefills; both decode (after a prefill); the second finished: the first alone, a new batch; the same
    # batch; the third's prefill beside the first's last token; the third alone (after a prefill); the same batch.
    assert flags == [0, 0, 0, 1, 0, 0, 1]
