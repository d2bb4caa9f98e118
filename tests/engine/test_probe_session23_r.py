"""Probe R of run-ahead (session 23): a failing ``arrivals_pending`` hook. The hook is asked only when a step is
about to be launched ahead; an exception from it failed the step already computed (every request of the batch
finished with an error) where the engine without run-ahead, which never asks it, served them all."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine import LLM, SamplingParams  # noqa: E402


def test_a_failing_arrivals_pending_hook_holds_the_step_back_and_fails_nothing(tiny_qwen3) -> None:
    prompts = [[(3 * i + k) % 500 for k in range(n)] for i, n in enumerate((5, 14, 9))]
    params = SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True)

    def outcome(run_ahead: bool, hook=None):
        llm = LLM(tiny_qwen3[0], run_ahead=run_ahead, block_size=16, max_model_len=64, num_gpu_blocks=16, seed=3)
        llm.runner.arrivals_pending = hook
        outs = llm.generate(prompts, params, use_tqdm=False)
        ran_ahead = llm.engine.step_log.to_arrow().column("ran_ahead").to_pylist()
        return [(o["token_ids"], o["finish_reason"], o["error"]) for o in outs], ran_ahead, llm.runner.timings

    expected, _, _ = outcome(False)
    calls = []

    def hook() -> bool:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the feeder's pipe is closed")
        return False

    got, ran_ahead, timings = outcome(True, hook)
    assert got == expected
    assert [o[1] for o in got] == ["length"] * 3
    assert timings.num_held_ahead_steps == 1 and len(calls) > 2
    assert sum(ran_ahead) == timings.num_ran_ahead_steps > 0
