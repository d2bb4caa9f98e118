"""Probe session 32 (helper Q): a step that fails for one request (RequestError) must not leave another request of the
same step counting as computed the prefix-cache hits the failed one registered in it: their KV was never written."""

from __future__ import annotations

from engine.core.runner import RequestError
from engine.core.sequence import FinishReason, SequenceStatus
from tests.engine.helpers import make_engine, params, run_to_completion


def _engine_failing_first_step_of(request_id: str):
    engine, runner = make_engine(block_size=4, num_gpu_blocks=64, max_num_batched_tokens=64)
    run = runner.run

    def failing(batch):
        blamed = [s for s in batch.seqs if s.request_id == request_id and s.num_computed_tokens == 0]
        if blamed:
            raise RequestError(blamed, "scripted failure")
        return run(batch)

    runner.run = failing
    return engine, runner


def test_a_request_sharing_blocks_a_failed_request_registered_in_the_step_starts_over() -> None:
    engine, runner = _engine_failing_first_step_of("A")
    prompt = list(range(10, 22))  # three blocks of 4
    a = engine.add_request(prompt, params(4), request_id="A")
    b = engine.add_request(prompt, params(4), request_id="B")
    batch, finished = engine.step()
    # B was admitted on A's first two blocks, registered in this very step, and computed only its last block
    assert [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)] == [("A", 12), ("B", 4)]
    assert finished == [a] and a.finish_reason is FinishReason.ERROR
    # A's step never wrote those blocks' KV: B may not count them as computed (it kept them, and computed only
    # tokens 8..11 next step, over KV that was never written)
    assert b.num_computed_tokens == 0 and b.block_table == [] and b.status is SequenceStatus.WAITING
    run_to_completion(engine)
    assert runner.batches[0] == [(b.seq_id, 12)]  # the whole prompt, computed afresh
    assert b.finish_reason is FinishReason.LENGTH and len(b.completion_token_ids) == 4
    assert engine.scheduler.block_manager.num_used_blocks == 0


def test_a_request_sharing_nothing_with_the_failed_one_keeps_its_progress() -> None:
    engine, runner = _engine_failing_first_step_of("A")
    a = engine.add_request(list(range(10, 22)), params(4), request_id="A")
    b = engine.add_request(list(range(30, 42)), params(4), request_id="B")
    engine.step()
    assert a.finish_reason is FinishReason.ERROR
    assert b.status is SequenceStatus.RUNNING and b.num_computed_tokens == 0 and len(b.block_table) == 3
    run_to_completion(engine)
    assert runner.batches[0] == [(b.seq_id, 12)] and b.num_preemptions == 0
    assert b.finish_reason is FinishReason.LENGTH and engine.scheduler.block_manager.num_used_blocks == 0
