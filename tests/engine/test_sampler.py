"""The sampler's torch path (engine.gpu.layers.sampler): the counter-based noise is the specified 32-bit hash,
draws follow softmax(logits / T), filters keep what they promise, and a row's draw depends on its words
alone. The Triton kernel is checked against this path on the GPU (test_gpu_kernels.py)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from engine.gpu.layers.sampler import MASK32, SamplingTensors, gumbel_noise, mix32, row_keys, sample  # noqa: E402


def py_mix32(x: int) -> int:
    """The hash on plain 32-bit unsigned integers: what the int64 tensor code must reproduce bit for bit."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x4C9F6B5B) & MASK32
    return x ^ (x >> 16)


def test_mix32_is_the_32_bit_hash_for_every_kind_of_input() -> None:
    values = [0, 1, 2, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 2, MASK32, 0xDEADBEEF, 123456789]
    assert mix32(torch.tensor(values)).tolist() == [py_mix32(v) for v in values]
    assert py_mix32(1) != 1 and py_mix32(0) == 0  # a fixed point at 0 only: keys mix it with other words
    words = torch.tensor([[0, 0, 0], [MASK32, MASK32, MASK32], [5, 6, 7]])
    expected = [py_mix32(py_mix32(py_mix32(a) ^ b) ^ c) for a, b, c in words.tolist()]
    assert row_keys(words).tolist() == expected


def test_noise_is_gumbel_on_a_23_bit_grid() -> None:
    keys = torch.tensor([py_mix32(9), 77])
    noise = gumbel_noise(keys, 5)
    for row, key in enumerate(keys.tolist()):
        for v in range(5):
            u = ((py_mix32(py_mix32(v) ^ key) >> 9) + 0.5) / 2**23  # exact in float32 (test_probe_session26_p)
            assert noise[row, v].item() == pytest.approx(-math.log(-math.log(u)), rel=1e-6)
    # Over many keys the noise has the Gumbel mean (Euler's constant) and variance (pi^2 / 6).
    many = gumbel_noise(torch.arange(20_000), 64)
    assert many.mean().item() == pytest.approx(0.5772, abs=0.01)
    assert many.var().item() == pytest.approx(math.pi**2 / 6, rel=0.02)


def _tensors(rows: int, temperature: float, top_k: int = -1, top_p: float = 1.0, step_value: int = 3):
    return SamplingTensors([temperature] * rows, [top_k] * rows, [top_p] * rows,
                           [(step_value, row, MASK32) for row in range(rows)], torch.device("cpu"))


def test_draws_follow_the_softmax_of_the_scaled_logits() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    rows = 60_000
    tokens = sample(logits.expand(rows, -1).contiguous(), _tensors(rows, temperature=0.7))
    freq = torch.bincount(tokens, minlength=6).double() / rows
    expected = (logits / 0.7).softmax(-1).double()
    assert torch.allclose(freq, expected, atol=0.006), (freq, expected)


def test_filters_keep_only_what_they_promise() -> None:
    logits = torch.tensor([3.0, 2.9, 2.8, 0.0, -1.0])
    rows = 4_000
    top2 = sample(logits.expand(rows, -1).contiguous(), _tensors(rows, temperature=1.0, top_k=2))
    assert set(top2.tolist()) == {0, 1}
    # Tokens 0-2 hold ~0.95 of the mass: top_p 0.5 keeps tokens 0 and 1 (0 alone holds less than 0.5).
    top_p = sample(logits.expand(rows, -1).contiguous(), _tensors(rows, temperature=1.0, top_p=0.5))
    assert set(top_p.tolist()) == {0, 1}
    greedy = sample(logits.expand(3, -1).contiguous(), _tensors(3, temperature=0.0))
    assert greedy.tolist() == [0, 0, 0]


def test_a_rows_draw_depends_on_its_words_alone() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1000, generator=gen)
    seeded = (42, 0, 5)
    words = [seeded, (1, 1, MASK32), (1, 2, MASK32), seeded, (1, 4, MASK32), (7, 0, 5)]
    # Row 4 asks for top-k: its companions keep the kernel's (here: the reference's) unfiltered draw.
    params = SamplingTensors([0.9, 0.9, 0.0, 0.9, 0.9, 0.9], [-1, -1, -1, -1, 10, -1], [1.0] * 6, words,
                             torch.device("cpu"))
    tokens = sample(logits, params).tolist()
    alone = sample(logits[3:4], SamplingTensors([0.9], [-1], [1.0], [seeded], torch.device("cpu"))).tolist()
    assert tokens[3] == alone[0]
    assert tokens[2] == logits[2].argmax().item()
    assert params.filtered_rows == [4]
    assert tokens[4] in logits[4].topk(10).indices.tolist()
    # The same logits under different token counts give different draws.
    same = logits[0:1].expand(64, -1).contiguous()
    spread = sample(same, SamplingTensors([1.0] * 64, [-1] * 64, [1.0] * 64,
                                          [(42, 0, n) for n in range(64)], torch.device("cpu")))
    assert len(set(spread.tolist())) > 20


def test_a_tiny_top_p_keeps_the_top_token() -> None:
    """top_p 1e-50 is 0 in float32: every token was masked; the noisy argmax of -inf was token 0, whatever the
    logits."""
    logits = torch.tensor([0.0, -1.0, 3.0, 1.0])
    tokens = sample(logits.expand(50, -1).contiguous(), _tensors(50, temperature=1.0, top_p=1e-50))
    assert tokens.tolist() == [2] * 50


def test_a_tiny_temperature_is_greedy() -> None:
    """logits / 1e-40 overflow float32 to inf: the draw was the first positive logit, not the largest (and a served
    request ended at once when that was an end-of-sequence token). Below 1e-5, as in vLLM, sampling is greedy."""
    from types import SimpleNamespace

    from engine.core.sampling_params import SamplingParams
    from engine.gpu.layers.sampler import SamplingRows

    for temperature in (1e-40, 1e-45, 1e-6):
        params = SamplingParams(temperature=temperature, seed=1)
        assert params.is_greedy and params.temperature == 0.0
    assert SamplingParams(temperature=1e-5).temperature == 1e-5
    logits = torch.tensor([[1.0, 2.0, 5.0, 3.0], [4.0, 0.5, 1.0, 2.0]])
    seqs = [SimpleNamespace(sampling_params=SamplingParams(temperature=t, top_k=2, seed=3), num_tokens=5,
                            num_prompt_tokens=4) for t in (1e-40, 1e-38)]
    rows = SamplingRows(seqs, vocab_size=4)
    assert sample(logits, rows.tensors(7, torch.device("cpu"))).tolist() == [2, 0]
