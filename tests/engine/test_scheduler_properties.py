"""Property-based checks of scheduler and block-manager invariants over random request mixes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.llm_engine import LLMEngine
from engine.core.runner import RunnerOutput
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import FinishReason, SequenceStatus
from tests.engine.helpers import ManualClock, SmallBlockConfig

BASES = [[1000 * g + i for i in range(80)] for g in range(4)]  # shared prefixes


class CheckingRunner:
    """Checks every batch against the limits before 'running' it."""

    def __init__(self, engine_ref: list, clock: ManualClock) -> None:
        self.engine_ref = engine_ref
        self.clock = clock
        self.running_before: set[int] = set()  # ids running when the step began
        self.released: set[int] = set()

    def run(self, batch):
        engine: LLMEngine = self.engine_ref[0]
        cfg = engine.config
        sched = engine.scheduler
        assert batch.seqs, "an empty batch was handed to the runner"
        assert len(batch.seqs) <= cfg.max_num_seqs
        assert sum(batch.num_new_tokens) <= cfg.max_num_batched_tokens
        assert len({s.seq_id for s in batch.seqs}) == len(batch.seqs)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            assert n >= 1
            assert seq.status is SequenceStatus.RUNNING and seq in sched.running
            assert seq.num_computed_tokens + n <= seq.num_tokens
            assert len(seq.block_table) * cfg.block_size >= seq.num_computed_tokens + n
        if cfg.policy == "nano":
            # A nano step either admits waiting sequences (prefill) or advances running ones (decode).
            admitted = {seq.seq_id not in self.running_before for seq in batch.seqs}
            assert len(admitted) == 1, "a nano step mixed prefill and decode"
            if admitted == {False}:
                assert all(n == 1 for n in batch.num_new_tokens)
        self.clock.t += 0.001
        return RunnerOutput([5] * len(batch.seqs))

    def release(self, seqs) -> None:
        for seq in seqs:
            assert seq.is_finished, "a sequence was released before it finished"
            assert seq.seq_id not in self.released, "a sequence was released twice"
            self.released.add(seq.seq_id)


def check_state(engine: LLMEngine) -> None:
    cfg = engine.config
    sched = engine.scheduler
    bm = sched.block_manager
    assert len(sched.running) <= cfg.max_num_seqs
    assert 0 <= bm.num_used_blocks <= cfg.num_gpu_blocks
    assert bm.num_free_blocks + bm.num_used_blocks == cfg.num_gpu_blocks
    for seq in sched.waiting:
        assert seq.block_table == [] and seq.status is SequenceStatus.WAITING
    references: dict[int, int] = {}
    for seq in sched.running:
        assert len(seq.block_table) >= -(-seq.num_computed_tokens // cfg.block_size)
        for block_id in seq.block_table:
            references[block_id] = references.get(block_id, 0) + 1
    for block_id, count in enumerate(bm.ref_counts):
        assert count == references.get(block_id, 0), (f"block {block_id}: ref {count}, "
                                                      f"referenced {references.get(block_id, 0)}")
    assert bm.num_used_blocks == len(references)


requests_strategy = st.lists(
    st.tuples(
        st.integers(0, 3),  # shared-prefix group
        st.integers(0, 60),  # shared prefix length
        st.integers(1, 40),  # own suffix length
        st.integers(1, 20),  # max_tokens
        st.integers(0, 25),  # arrival step
    ),
    min_size=1,
    max_size=25,
)


SCENARIOS = dict(
    policy=st.sampled_from(["mixed", "nano"]),
    block_size=st.sampled_from([1, 2, 4, 8]),
    num_gpu_blocks=st.integers(1, 48),
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(1, 64),
    max_model_len=st.integers(1, 128),
    prefix_caching=st.booleans(),
    requests=requests_strategy,
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIOS)
def test_invariants_hold_every_step_and_everything_finishes(
    policy, block_size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens, max_model_len, prefix_caching, requests
):
    cfg = SmallBlockConfig(
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        policy=policy,
        enable_prefix_caching=prefix_caching,
    )
    clock = ManualClock()
    ref: list = []
    runner = CheckingRunner(ref, clock)
    engine = LLMEngine(cfg, runner, clock=clock, eos_token_ids=(2,))
    ref.append(engine)
    by_step: dict[int, list] = {}
    for r in requests:
        by_step.setdefault(r[4], []).append(r)
    seqs = []
    step = 0
    while step <= 25 or engine.has_unfinished_requests():
        for group, shared, own, max_tokens, _ in by_step.get(step, []):
            tokens = BASES[group][:shared] + [50_000 + len(seqs) * 100 + i for i in range(own)]
            seqs.append(engine.add_request(tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
        runner.running_before = {seq.seq_id for seq in engine.scheduler.running}
        engine.step()
        check_state(engine)
        step += 1
        assert step < 5_000, "the engine stalled"
    for seq in seqs:
        assert seq.is_finished
        if seq.finish_reason is FinishReason.REJECTED:
            assert seq.reject_reason
            continue
        asked = seq.num_prompt_tokens + seq.sampling_params.max_tokens
        limit = max(cfg.max_seq_len, seq.num_prompt_tokens + 1)  # a prefill's one token is never cut
        assert seq.finish_reason is (FinishReason.LENGTH if asked <= limit else seq.length_reason)
        assert seq.finish_reason.served and (seq.finish_reason.is_cut == (asked > limit))
        expected = min(asked, cfg.max_seq_len)
        assert seq.num_tokens == max(expected, seq.num_prompt_tokens + 1)
        assert len(seq.token_times_s) == seq.num_completion_tokens
    bm = engine.scheduler.block_manager
    assert bm.num_used_blocks == 0 and all(c == 0 for c in bm.ref_counts)
    # Every sequence that reached the runner is released to it exactly once (rejected ones never ran).
    assert runner.released == {s.seq_id for s in seqs if s.finish_reason is not FinishReason.REJECTED}


@pytest.mark.slow
@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SCENARIOS)
def test_invariants_hold_over_thousands_of_random_scenarios(**scenario):
    """The same invariants over many more scenarios (python -m pytest -m slow)."""
    test_invariants_hold_every_step_and_everything_finishes.hypothesis.inner_test(**scenario)
