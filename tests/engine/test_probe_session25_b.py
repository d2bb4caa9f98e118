"""Probe B of session 25: hostile inputs to the HTTP server, the benchmark client and ``LLM.generate``."""

from __future__ import annotations

import pytest

from engine.core.sampling_params import SamplingParams


def _numpy():
    return pytest.importorskip("numpy")


def test_numpy_scalars_in_sampling_params_are_python_numbers() -> None:
    """SamplingParams took numpy integers as they were: a seed of np.int8(5) failed the request in the engine's step
    ("OverflowError: Python integer 4294967295 out of bounds for int8", a traceback in the log), and max_tokens
    np.uint64(2**64 - 1) wrapped around when added to the prompt's length: one token, finished "length"."""
    np = _numpy()
    params = SamplingParams(temperature=np.float32(0.5), top_p=np.float16(0.5), top_k=np.uint8(5),
                            max_tokens=np.uint64(2**64 - 1), seed=np.int8(5))
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed) == (0.5, 0.5, 5, 2**64 - 1,
                                                                                                 5)
    assert [type(v) for v in (params.temperature, params.top_p, params.top_k, params.max_tokens, params.seed)] == [
        float, float, int, int, int]
    assert type(SamplingParams(temperature=1).temperature) is int  # exact ints and floats are kept as they are


def test_numpy_seed_and_max_tokens_generate_as_their_python_values(tiny_qwen3) -> None:
    pytest.importorskip("torch")
    np = _numpy()
    from engine import LLM

    llm = LLM(tiny_qwen3[0], device="cpu", block_size=16, max_model_len=32, num_gpu_blocks=16)
    prompt = [[1, 2, 3]]

    def run(**kwargs) -> tuple:
        [out] = llm.generate(prompt, SamplingParams(temperature=1.0, ignore_eos=True, **kwargs), use_tqdm=False)
        return out["token_ids"], out["finish_reason"], out["error"]

    assert run(seed=np.int8(5), max_tokens=4) == run(seed=5, max_tokens=4)
    assert run(seed=5, max_tokens=4)[1:] == ("length", None)
    for huge in (np.uint64(2**64 - 1), np.int64(2**63 - 1)):
        tokens, reason, error = run(seed=5, max_tokens=huge)
        assert (len(tokens), reason, error) == (29, "max_model_len", None)  # cut by the limit, and says so
