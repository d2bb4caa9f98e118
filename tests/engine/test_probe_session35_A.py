"""Quiet windows planned from the steady decodes (engine.core.quiet_window._plan_steady) are the windows planned row by
row: the same steps, segments, step ends, blocks, finishes and tokens, whether the horizon, a finish, the step cap or a
full cache ends them, cut or not; and they handle only the rows filed under their steps (the others owe the tokens).

Two schedulers run the same requests in lockstep, one with lazy tokens (its windows planned from the calendar where
every running sequence is steady and nobody waits) and one without (every window planned row by row)."""

from __future__ import annotations

import random
from array import array

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.config import EngineConfig
from engine.core.quiet_window import QuietRun, plan_quiet_window
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.steady_decodes import SteadyDecodes


class _Engine:
    """What plan_quiet_window and QuietRun need of an engine."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.runner = self
        self.step_log = self
        self.rows: list[tuple] = []

    def release(self, seqs) -> None:
        pass

    def extend_quiet(self, *args) -> None:
        self.rows.append(tuple(list(a) if isinstance(a, (array, list, np.ndarray)) else a for a in args))

    num_rows = 0


def _ends(bs: int, context: int, longest: int, continues: int, start_s: float, max_steps: int, horizon_s: float,
          cross: bool) -> np.ndarray:
    """Step ends of a decode batch given by its numbers, each the one before plus its step's price (a function of
    that step's contexts alone: the same floats however a run is split)."""
    ends = []
    t_s = start_s
    for i in range(max_steps):
        t_s = t_s + (1.0 + 0.01 * bs + 1e-5 * (context + bs * i) + 1e-4 * (longest + i) + (0.0 if continues or i
                                                                                          else 0.5))
        if t_s >= horizon_s:
            if cross:
                ends.append(t_s)
            break
        ends.append(t_s)
    return np.array(ends, dtype=np.float64)


def _segment_ends(bs, context, longest, continues, start_s, max_steps, horizon_s, cross):
    if bs % 7 == 0:  # no price by numbers: asked through step_ends with a batch
        return None
    return _ends(bs, context, longest, continues, start_s, max_steps, horizon_s, cross)


def _step_ends(batch, start_s, max_steps, horizon_s, cross):
    assert len(batch.seqs) == batch.num_decode_seqs
    return _ends(batch.num_decode_seqs, batch.decode_context_tokens, batch.max_decode_context_tokens,
                 batch.continues_batch, start_s, max_steps, horizon_s, cross)


def _request(rng: random.Random) -> tuple[list[int], SamplingParams]:
    prompt = [rng.randrange(8, 50) for _ in range(rng.randrange(1, 90))]
    if rng.random() < 0.3:  # a shared prefix, for prefix-cache hits
        prompt = list(range(100, 140)) + prompt
    return prompt, SamplingParams(max_tokens=rng.randrange(1, 160), ignore_eos=rng.random() < 0.2)


def _state(scheduler: Scheduler) -> list:
    scheduler.settle_tokens()
    return [(s.seq_id, list(s.block_table), s.num_computed_tokens, list(s.token_ids), list(s.token_times_s),
             s.num_registered_blocks) for s in scheduler.running] + [scheduler.block_manager.num_free_blocks]


def _window(scheduler: Scheduler, start_s: float, horizon_s: float, cross: bool, max_steps: int, cut_share: float):
    engine = _Engine(scheduler)
    planned = plan_quiet_window(engine, 9, _step_ends, start_s, horizon_s, max_steps=max_steps, cross_horizon=cross,
                                segment_ends=_segment_ends)
    if planned is None:
        return None, None
    window, starts, ends = planned
    facts = (window.num_steps, window.end_s, window.stopped_by_horizon, list(window.bounds), list(window.batches),
             window.continues_first, list(starts), list(ends))
    run = QuietRun(engine, 9, window, starts, ends)
    if cut_share:
        cut_s = starts[0] + cut_share * (ends[-1] - starts[0])
        if cut_s not in starts and cut_s not in ends:
            run.advance(cut_s)
            run.cut(cut_s)
    finished = [(s.seq_id, list(s.token_ids), list(s.token_times_s), s.finish_s) for s in run.finish()]
    return (facts, finished, engine.rows, window.num_steps), window.due


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([16, 32]), num_blocks=st.sampled_from([70, 150, 600]),
       caching=st.booleans(), policy=st.sampled_from(["mixed", "nano"]), cross=st.booleans(),
       cut=st.sampled_from([0.0, 0.4]))
def test_windows_from_the_calendar_are_the_row_by_row_windows(seed, block_size, num_blocks, caching, policy, cross,
                                                               cut):
    config = EngineConfig(block_size=block_size, enable_prefix_caching=caching, policy=policy, max_num_seqs=48,
                          max_num_batched_tokens=512).resolved(num_gpu_blocks=num_blocks, max_model_len=512)
    lazy = Scheduler(config, eos_token_ids=[7], lazy_tokens=True)
    eager = Scheduler(config, eos_token_ids=[7])
    rng = random.Random(seed)
    requests = [_request(rng) for _ in range(120)]
    arrivals = sorted(rng.randrange(0, 60) for _ in requests)
    next_request = 0
    now_s = 0.0
    num_from_calendar = num_fewer_rows = 0
    for step in range(1500):
        while next_request < len(requests) and arrivals[next_request] <= step:
            for scheduler in (lazy, eager):
                scheduler.add(Sequence(next_request, *requests[next_request]))
            next_request += 1
        if step % 3 == 2:
            horizon_s = now_s + rng.choice([0.5, 3.0, 9.0, 40.0, float("inf")])
            max_steps = rng.choice([2, 5, 30, 1 << 16])
            got, due = _window(lazy, now_s, horizon_s, cross, max_steps, cut)
            expected, _ = _window(eager, now_s, horizon_s, cross, max_steps, cut)
            assert got == expected
            if got is not None:
                now_s = got[0][1] if not cut else max(now_s, got[0][7][-1] if got[0][7] else now_s)
                if due is not None:
                    num_from_calendar += 1
                    num_fewer_rows += len(due) < len(expected[0][4][0]) if expected[0][4] else 0
                assert _state(lazy) == _state(eager)
        a, b = lazy.schedule(now_s), eager.schedule(now_s)
        assert [s.seq_id for s in a.seqs] == [s.seq_id for s in b.seqs]
        assert (a.decode_context_tokens, a.max_decode_context_tokens) == (b.decode_context_tokens,
                                                                          b.max_decode_context_tokens)
        if not a.seqs:
            if next_request == len(requests) and not lazy.has_unfinished():
                break
            continue
        now_s += 1.0
        done_a = lazy.postprocess(a, [9] * len(a.seqs), now_s)
        done_b = eager.postprocess(b, [9] * len(b.seqs), now_s)
        assert [(s.seq_id, list(s.token_ids), list(s.token_times_s)) for s in done_a] == \
            [(s.seq_id, list(s.token_ids), list(s.token_times_s)) for s in done_b]
    assert _state(lazy) == _state(eager)
    if num_blocks == 600 and policy == "mixed":
        assert num_from_calendar > 0


def test_a_window_from_the_calendar_handles_only_the_rows_filed_under_its_steps():
    """40 steady decodes, 10 of them filed under the window's 5 steps (their blocks of 16 fill then, staggered by their
    prompts): the window handles those 10; the others owe its tokens and token times, paid when settled."""
    config = EngineConfig(block_size=16, enable_prefix_caching=False, max_num_seqs=64,
                          max_num_batched_tokens=2048).resolved(num_gpu_blocks=400, max_model_len=512)
    scheduler = Scheduler(config, lazy_tokens=True)
    for i in range(40):
        scheduler.add(Sequence(i, [20] * (1 + 2 * i), SamplingParams(max_tokens=200, ignore_eos=True)))
    now_s = 0.0
    for _ in range(3):  # the prompts, then two decode steps: every row filed, the last step's tokens owed
        now_s += 1.0
        batch = scheduler.schedule(now_s)
        scheduler.postprocess(batch, [9] * len(batch.seqs), now_s)
    steady: SteadyDecodes = scheduler.steady_decodes
    assert steady.covers(scheduler.running)
    # Sequence i holds 4 + 2i tokens (3 + 2i computed): its next token opens a block (-(4 + 2i)) % 16 + 1 steps on,
    # within the window's 5 steps for i % 8 in (5, 6).
    engine = _Engine(scheduler)
    window, starts, ends = plan_quiet_window(engine, 9, _step_ends, now_s, float("inf"), max_steps=5,
                                             segment_ends=_segment_ends)
    assert [seq.seq_id for seq in window.due] == [i for i in range(40) if i % 8 in (5, 6)]
    assert window.num_steps == 5 and window.bounds == [0, 5] and not window.stopped_by_horizon
    assert window.batches == [(40, sum(4 + 2 * i for i in range(40)), 4 + 2 * 39)]
    run = QuietRun(engine, 9, window, starts, ends)
    assert run.finish() == []
    handled = next(s for s in scheduler.running if s.seq_id == 5)  # its tokens appended
    assert len(handled.token_ids) == 14 + 5 and handled.num_computed_tokens == 13 + 5
    owing = next(s for s in scheduler.running if s.seq_id == 3)  # owes the window's 5 tokens (and the step's before)
    assert len(owing.token_ids) <= 10 - 1
    scheduler.settle_tokens()
    assert len(owing.token_ids) == 10 + 5 and owing.num_computed_tokens == 9 + 5
    assert list(owing.token_ids[-7:]) == [9] * 7 and list(owing.token_times_s[-5:]) == list(ends)
    assert list(handled.token_times_s[-5:]) == list(ends)
