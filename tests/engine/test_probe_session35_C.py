"""Session 35, probe C: the scheduler's large-batch path (engine.core.steady_decodes) from fewer rows.

``Scheduler.min_steady_rows`` is the fewest running sequences that take the path: 32 for the GPU engine, 16 for the
simulator (lazy tokens; measured lower, it cost more: see _MIN_LAZY_STEADY_ROWS). From at most _MAX_SPECIAL_ROWS (16)
rows, the path must still start: before, such a batch of unfiled rows took ``_advance_steady`` with every row special,
which succeeded, so postprocess never began filing them and the path ran every step without one steady row."""

from __future__ import annotations

import random

import pytest

from engine.core.config import EngineConfig
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import _MIN_LAZY_STEADY_ROWS, _MIN_STEADY_ROWS, Scheduler
from engine.core.sequence import Sequence
from tests.engine.test_steady_decodes import EOS, _arrive, _quiet_run, _request, _same_batch, _same_state, _token


def test_the_engine_keeps_its_threshold_and_the_simulator_takes_the_path_from_16_rows():
    config = EngineConfig(block_size=16).resolved(num_gpu_blocks=100, max_model_len=512)
    assert _MIN_STEADY_ROWS == 32 and _MIN_LAZY_STEADY_ROWS == 16
    assert Scheduler(config).min_steady_rows == 32
    assert Scheduler(config, lazy_tokens=True).min_steady_rows == 16


def test_a_small_batch_is_filed_once_it_takes_the_path():
    """Three rows, the path from one row on: the first step that takes it goes row by row and files the rows (none
    was known), every later one has no special row and the rows owe their tokens (lazy)."""
    config = EngineConfig(block_size=16).resolved(num_gpu_blocks=100, max_model_len=512)
    scheduler = Scheduler(config, lazy_tokens=True)
    scheduler.min_steady_rows = 1
    seqs = [Sequence(i, list(range(8, 12 + i)), SamplingParams(max_tokens=100)) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    batch = scheduler.schedule(0.0)  # three prompts, admitted: the running list was empty
    assert batch.special_rows is None and batch.num_prefill_seqs == 3
    scheduler.postprocess(batch, [9] * 3, 1.0)
    steady = scheduler.steady_decodes
    assert not steady.steady  # (not filing: the batch was empty when the step began)
    batch = scheduler.schedule(1.0)  # three rows: the path, from rows not yet known, row by row
    assert batch.special_rows is None and batch.num_decode_seqs == 3
    scheduler.postprocess(batch, [9] * 3, 2.0)
    # Each has computed 5 + i tokens in one 16-token block: filed under the step that fills it (registered), 10 - i on.
    assert list(steady.steady.values()) == [10, 9, 8] and not steady.unsteady
    batch = scheduler.schedule(2.0)
    assert batch.special_rows == [] and batch.steady_rows == 3
    assert (batch.decode_context_tokens, batch.max_decode_context_tokens) == (6 + 7 + 8, 8)
    scheduler.postprocess(batch, [9] * 3, 3.0)
    assert [len(seq.token_ids) for seq in seqs] == [6, 7, 8]  # owed, not appended
    scheduler.settle_tokens()
    assert [list(seq.token_times_s) for seq in seqs] == [[1.0, 2.0, 3.0]] * 3
    assert [len(seq.token_ids) for seq in seqs] == [7, 8, 9]
    assert [seq.num_computed_tokens for seq in seqs] == [6, 7, 8]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("min_rows", [1, 2, 3])
def test_small_batches_on_the_path_schedule_as_the_per_row_loop(seed, min_rows):
    """Batches of a few rows (arrivals spread out, some idle steps), the path from ``min_rows`` rows with lazy tokens,
    in lockstep with the per-row loop appending every token: the same batches, finishes, tokens and state, quiet
    windows (planned from the calendar where every row is steady) included; and the path's steps had plain rows."""
    rng = random.Random(seed)
    caching = seed % 2 == 0
    config = EngineConfig(block_size=16, enable_prefix_caching=caching, policy="nano" if seed % 3 == 2 else "mixed",
                          max_num_seqs=8, max_num_batched_tokens=256).resolved(num_gpu_blocks=60 + 40 * (seed % 3),
                                                                               max_model_len=512)
    fast = Scheduler(config, eos_token_ids=[EOS], lazy_tokens=True)
    fast.min_steady_rows = min_rows
    slow = Scheduler(config, eos_token_ids=[EOS])
    slow.steady_plain_decodes = False
    requests = [_request(i, rng) for i in range(40)]
    arrivals = sorted(rng.randrange(0, 300) for _ in requests)  # a few running at once
    next_request = 0
    plain_steps = windows = 0
    for step in range(2000):
        next_request = _arrive((fast, slow), requests, arrivals, next_request, step)
        if step % 7 == 6:
            planned = fast.steady_decodes.covers(fast.running)
            finished = _quiet_run(fast, 9, 20)
            assert finished == _quiet_run(slow, 9, 20)
            if finished is not None:
                windows += planned
                fast.settle_tokens()
                _same_state(fast, slow)
        a, b = fast.schedule(float(step)), slow.schedule(float(step))
        _same_batch(a, b)
        if not a.seqs:
            if next_request == len(requests) and not fast.has_unfinished():
                break
            continue
        plain_steps += a.special_rows is not None and len(a.special_rows) < a.steady_rows
        tokens = [9 if step % 13 else _token(seq, 0.0) for seq in b.seqs]  # mostly one token: lazy steps
        done_a = fast.postprocess(a, tokens, float(step) + 0.5)
        done_b = slow.postprocess(b, tokens, float(step) + 0.5)
        assert [(s.seq_id, s.finish_reason, list(s.token_ids), list(s.token_times_s)) for s in done_a] == \
               [(s.seq_id, s.finish_reason, list(s.token_ids), list(s.token_times_s)) for s in done_b]
    assert not fast.has_unfinished() and not slow.has_unfinished()
    assert plain_steps > 0 and windows > 0


@pytest.mark.parametrize("block_size", [16, 256])
def test_the_simulators_batches_of_16_to_31_rows_give_the_outputs_of_the_step_loop(block_size, monkeypatch):
    """The simulator (lazy tokens) takes the path from 16 rows: batches of some 16-31 sequences, their quiet windows
    planned from the calendar (QuietWindow.due), give the outputs of stepping every step with every token appended,
    byte for byte."""
    from sim import simulator
    from sim.config import SimConfig
    from tests.sim.helpers import make_trace

    rng = random.Random(block_size)
    n = 150
    trace = make_trace([rng.randrange(20, 600) for _ in range(n)], [rng.randrange(200, 500) for _ in range(n)],
                       sorted(rng.uniform(0.0, 4.0) for _ in range(n)))
    config = SimConfig(block_size=block_size)
    planned = []

    class Recorded(simulator.QuietRun):
        __slots__ = ()

        def __init__(self, engine, token_id, window, starts, ends) -> None:
            if window.due is not None:
                planned.append(len(engine.scheduler.running))
            super().__init__(engine, token_id, window, starts, ends)

    with monkeypatch.context() as patch:
        patch.setattr(simulator, "QuietRun", Recorded)
        forwarded = simulator.simulate(trace, config)
    stepped = simulator.simulate(trace, config, fast_forward=False, lazy_tokens=False)
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
    assert sum(16 <= rows < 32 for rows in planned) > 25  # (75 and 50 windows)
