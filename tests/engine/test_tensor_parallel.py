"""tensor_parallel_size=2 over gloo on CPU gives the same greedy tokens as a single process."""

from __future__ import annotations

import multiprocessing

import pytest

torch = pytest.importorskip("torch")

from engine import LLM, SamplingParams  # noqa: E402


def test_tp2_gloo_matches_tp1(tiny_qwen3):
    path, _ = tiny_qwen3
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 500, (n,), generator=g).tolist() for n in (3, 20, 45, 70)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    options = dict(block_size=16, max_model_len=128, max_num_batched_tokens=64, device="cpu")
    single = LLM(path, **options)
    expected = [o["token_ids"] for o in single.generate(prompts, params, use_tqdm=False)]
    single.close()
    with LLM(path, tensor_parallel_size=2, **options) as llm:
        got = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
        workers = llm.runner._workers
    assert got == expected
    assert all(not w.is_alive() for w in workers), "workers must exit when the engine closes"
    assert not multiprocessing.active_children()


def test_tp_size_must_divide_heads(tiny_qwen3):
    path, _ = tiny_qwen3
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size"):
        LLM(path, tensor_parallel_size=3, block_size=16, max_model_len=128, device="cpu")
    assert not multiprocessing.active_children(), "a failed start must not leave workers behind"
    assert not torch.distributed.is_initialized()
