"""Run-ahead (ModelRunner.RanAhead): the next decode step is launched before this one's tokens reach the host. It
must change nothing the engine decides or samples: the same tokens and the same schedule as without it, through
rows whose next token opens a block (scratch blocks), arrivals, stop tokens, aborts and preemptions (which throw
the launched step away), seeded and unseeded sampling."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.records import STEP_COLUMNS  # noqa: E402

_SCHEDULE_COLUMNS = [c.name for c in STEP_COLUMNS if c.source in ("id", "batch", "engine")]


def _llm(model_dir: str, run_ahead: bool, **options) -> LLM:
    kwargs = dict(block_size=16, max_model_len=256, num_gpu_blocks=64, seed=3)
    return LLM(model_dir, run_ahead=run_ahead, **{**kwargs, **options})


def _serve(engine, prompts, params, *, arrive_at=6, abort_at=None) -> list:
    """Four requests, the others arriving at step ``arrive_at`` (mid-decode); the second request aborted at step
    ``abort_at``; stepped to the end."""
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts[:4], params[:4])]
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == arrive_at:
            seqs += [engine.add_request(p, sp) for p, sp in zip(prompts[4:], params[4:])]
        if steps == abort_at:
            engine.abort_request(seqs[1])
    return seqs


def _outcome(llm: LLM, seqs: list) -> tuple:
    steps = llm.engine.step_log.to_arrow().select(_SCHEDULE_COLUMNS).to_pylist()
    return [s.token_ids for s in seqs], [s.finish_reason for s in seqs], steps


def _prompts(lengths) -> list[list[int]]:
    return [[(3 * i + k) % 500 for k in range(n)] for i, n in enumerate(lengths)]


def test_run_ahead_changes_no_token_and_no_step(tiny_qwen3) -> None:
    prompts = _prompts((5, 14, 15, 30, 47, 9))
    # Greedy, unseeded and seeded sampled rows; ignore_eos off for one (the model's eos may stop it).
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, max_tokens=12 + 7 * i, ignore_eos=i != 2,
                             seed=1000 + i if i % 2 else None) for i in range(len(prompts))]
    off = _llm(tiny_qwen3[0], run_ahead=False)
    expected = _outcome(off, _serve(off.engine, prompts, params))
    on = _llm(tiny_qwen3[0], run_ahead=True)
    runner = on.runner
    copied = []
    real_copy = runner._copy_blocks
    runner._copy_blocks = lambda sources, targets: (copied.append(len(targets)), real_copy(sources, targets))
    assert _outcome(on, _serve(on.engine, prompts, params)) == expected
    timings = runner.timings
    assert timings.num_ran_ahead_steps > 20
    assert timings.num_discarded_ahead_steps >= 1  # the arrivals at step 6 met a step launched ahead
    assert sum(copied) > 3  # rows whose token opened a block ran ahead through a scratch block
    assert timings.num_prepared_steps == 0 or timings.num_prepared_steps < timings.num_ran_ahead_steps


def test_a_stop_token_an_abort_and_preemptions_throw_the_launched_step_away(tiny_qwen3) -> None:
    prompts = _prompts((20, 33, 17, 40, 25, 12))
    params = [SamplingParams(max_tokens=30 + 9 * i, ignore_eos=True, temperature=0.0 if i % 2 else 0.9,
                             seed=7 if i in (0, 3) else None) for i in range(len(prompts))]
    # 12 blocks of 16 tokens for four running requests growing to 60-100 tokens each: the newest are preempted.
    options = dict(num_gpu_blocks=12, max_num_seqs=4)
    off = _llm(tiny_qwen3[0], run_ahead=False, **options)
    probe = _serve(off.engine, prompts, params, arrive_at=2, abort_at=25)[0]
    # The tenth token the first request samples stops it (the steps before are the same with the stop token).
    params[0] = dataclasses.replace(params[0], stop_token_ids=[probe.token_ids[len(prompts[0]) + 9]])
    off = _llm(tiny_qwen3[0], run_ahead=False, **options)
    expected = _outcome(off, _serve(off.engine, prompts, params, arrive_at=2, abort_at=25))
    assert sum(step["num_preempted"] for step in expected[2]) > 0
    assert expected[1][0].value == "stop" and expected[1][1].value == "aborted"
    on = _llm(tiny_qwen3[0], run_ahead=True, **options)
    assert _outcome(on, _serve(on.engine, prompts, params, arrive_at=2, abort_at=25)) == expected
    assert on.runner.timings.num_ran_ahead_steps > 20 and on.runner.timings.num_discarded_ahead_steps >= 2


def test_without_a_scratch_block_for_every_row_opening_one_the_step_is_not_launched_ahead(tiny_qwen3) -> None:
    """Rows in lockstep open blocks together; with fewer scratch blocks than such rows that step runs as before."""
    prompts = [[(7 * i + k) % 500 for k in range(16)] for i in range(4)]  # every row opens a block every 16 tokens
    params = [SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.5, seed=i) for i in range(4)]
    off = _llm(tiny_qwen3[0], run_ahead=False)
    expected = _outcome(off, _serve(off.engine, prompts, params, arrive_at=0))
    on = _llm(tiny_qwen3[0], run_ahead=True)
    on.runner._scratch_blocks = on.runner._scratch_blocks[:3]
    assert _outcome(on, _serve(on.engine, prompts, params, arrive_at=0)) == expected
    timings = on.runner.timings
    # The three steps before those opening four blocks (at positions 32, 48 and 64) were not launched ahead: each
    # was planned during the step before (NextDecode) instead.
    assert timings.num_prepared_steps == 3 and timings.num_ran_ahead_steps == 60 - 2 - 3


def test_a_step_is_not_launched_ahead_while_a_request_is_arriving(tiny_qwen3) -> None:
    """The engine's feeder says a request came during the step (``arrivals_pending``): the next batch admits it, so
    the step after is not launched ahead (and not thrown away); nothing else changes."""
    prompts = _prompts((5, 14, 15, 30, 47, 9))
    params = [SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.7) for _ in prompts]
    off = _llm(tiny_qwen3[0], run_ahead=False)
    expected = _outcome(off, _serve(off.engine, prompts, params))
    on = _llm(tiny_qwen3[0], run_ahead=True)
    on.runner.arrivals_pending = lambda: len(on.engine.step_log) == 5  # during the sixth step, as _serve adds two
    assert _outcome(on, _serve(on.engine, prompts, params)) == expected
    timings = on.runner.timings
    assert (timings.num_held_ahead_steps, timings.num_discarded_ahead_steps) == (1, 0)


def test_run_ahead_is_an_option(tiny_qwen3) -> None:
    from engine.core.config import ConfigError

    assert _llm(tiny_qwen3[0], run_ahead=False).runner.num_scratch_blocks == 0
    llm = _llm(tiny_qwen3[0], run_ahead=True, max_num_seqs=64)
    assert llm.runner.num_scratch_blocks == 2 * 64 // 16 + 4  # outside the block manager's 64
    assert llm.engine.config.num_gpu_blocks == 64
    with pytest.raises(ConfigError, match="run_ahead must be true or false, got 'no'"):
        _llm(tiny_qwen3[0], run_ahead="no")


def test_a_launch_ahead_that_fails_costs_the_step_before_nothing(tiny_qwen3, monkeypatch) -> None:
    """The step whose successor could not be launched ahead keeps its tokens; the successor runs when scheduled, with
    the random word the failed launch drew (unseeded sampled rows get the tokens they would without run-ahead)."""
    prompts = _prompts((5, 14, 15, 30))
    params = [SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.8) for _ in prompts]
    off = _llm(tiny_qwen3[0], run_ahead=False)
    expected = _outcome(off, _serve(off.engine, prompts, params))
    on = _llm(tiny_qwen3[0], run_ahead=True)
    calls = [0]
    real_launch = on.runner._launch_planned

    def failing_every_third(*args):
        calls[0] += 1
        if calls[0] % 3 == 0:
            raise RuntimeError("out of memory (simulated)")
        return real_launch(*args)

    monkeypatch.setattr(on.runner, "_launch_planned", failing_every_third)
    assert _outcome(on, _serve(on.engine, prompts, params)) == expected
    assert calls[0] >= 6 and on.runner.timings.num_ran_ahead_steps > 0
