"""Probe P (session 26): does the sampler draw from softmax(filter(logits / T))?

What the probe found:

* The uniform draw behind the Gumbel noise was ``((bits >> 8) + 0.5) * 2**-24`` in float32. A 24-bit ``m`` plus
  0.5 needs a 25-bit significand: ``(2**24 - 1) + 0.5`` rounded up to ``2**24``, ``u`` to 1.0 and the noise to
  ``-log(-log(1)) = +inf``. One (row, token) in 2**24 hit it, so about 0.9 % of the rows of a 151936-token vocabulary
  drew a uniformly random token whatever the logits: 16 rows in 2000 with one logit 30 above the rest (probability of
  any other token ~1e-8), and as many under ``top_k=1`` or ``top_p=1e-6`` (the masked token's ``-inf + inf`` is a
  NaN, which ``argmax`` takes). The Triton kernel computed the same bits. Now ``u = (m + 0.5) * 2**-23`` with a
  23-bit ``m``: exact in float32, strictly inside (0, 1), so the noise is finite.
* top-p summed the sorted probabilities from the top in float32 and dropped a token once the sum before it reached
  top_p: the sum reached 1.0 with tokens left, so ``top_p=1.0`` (off) beside ``top_k=150000`` kept only 44212 of the
  150000 tokens (logits 5 * N(0, 1) over 151936), and ``top_p=0.99999`` kept 39843 where the nucleus has 52312. The
  mass moved was ~2e-5, but the filter did not keep what it promises. Now the test is HF's and vLLM's: drop a token
  when it and the tokens below it hold at most ``1 - top_p``, summed from the least likely up.

Expectations (all deterministic: fixed generators and fixed noise words):

* the noise is finite on every (row, token) of 600 keys x 151936 tokens;
* 800 draws at vocab 151936 with four live tokens (logits 3, 2, 1, 0; the rest -30, together ~1e-8 of the mass):
  no draw outside the four, and their frequencies within total variation 0.06 of their softmax (the sampling error
  is ~0.02); under top_k / top_p, rows whose old noise was infinite somewhere (HIT_ROWS) draw only live tokens, and
  under top_k=1 or top_p=1e-6 only the argmax;
* top_p 1.0 beside top_k k keeps exactly the k largest logits, and top_p 0.9 / 0.999 / 0.99999 keep exactly
  the nucleus computed in float64.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.gpu.layers.sampler import (  # noqa: E402
    MASK32,
    SamplingTensors,
    _apply_top_k_top_p,
    gumbel_noise,
    sample,
)

VOCAB = 151936  # Qwen's


def test_the_noise_is_finite_over_a_full_vocabulary() -> None:
    for start in range(0, 600, 200):  # ~0.9 % of keys had an infinite element: about 5 of these 600
        noise = gumbel_noise(torch.arange(start, start + 200), VOCAB)
        assert torch.isfinite(noise).all(), f"keys {start}..{start + 199}"


# Rows whose noise words (17, row, 2**32 - 1) had an infinite element under the old 24-bit grid (found by
# recomputing it), and so drew the token of that element: 4495, 114155, ... in order.
HIT_ROWS = [250, 279, 371, 384, 735, 764, 786, 952]


def _draws(logits: torch.Tensor, rows: list[int], temperature: float = 1.0, top_k: int = -1,
           top_p: float = 1.0) -> torch.Tensor:
    out = []
    for start in range(0, len(rows), 200):  # 200 rows of 151936 at a time: the noise's int64 bits are 240 MB
        chunk = rows[start:start + 200]
        n = len(chunk)
        params = SamplingTensors([temperature] * n, [top_k] * n, [top_p] * n, [(17, r, MASK32) for r in chunk],
                                 torch.device("cpu"))
        out.append(sample(logits.expand(n, -1).contiguous(), params))
    return torch.cat(out)


LIVE = [70_001, 5, 151_935, 99]


@pytest.fixture(scope="module")
def four_live_tokens() -> torch.Tensor:
    logits = torch.full((VOCAB,), -30.0)
    logits[LIVE] = torch.tensor([3.0, 2.0, 1.0, 0.0])
    return logits


def test_draws_over_a_full_vocabulary_follow_the_softmax(four_live_tokens) -> None:
    rows = 800  # rows 0-799 hold 7 of HIT_ROWS
    tokens = _draws(four_live_tokens, list(range(rows)))
    counts = torch.bincount(tokens, minlength=VOCAB)
    assert counts[LIVE].sum().item() == rows, sorted(set(tokens.tolist()) - set(LIVE))
    target = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64).softmax(-1)
    freq = counts[LIVE].double() / rows
    # The expected total variation of 800 draws from these four is ~0.02.
    assert 0.5 * (freq - target).abs().sum().item() < 0.06, (freq, target)


@pytest.mark.parametrize("top_k,top_p", [(50, 1.0), (-1, 0.999), (2, 0.9)])
def test_filtered_draws_stay_among_the_live_tokens(four_live_tokens, top_k, top_p) -> None:
    tokens = _draws(four_live_tokens, HIT_ROWS + list(range(8)), top_k=top_k, top_p=top_p)
    allowed = set(LIVE[:2]) if top_k == 2 else set(LIVE)  # top_k 2, then top_p 0.9 of 0.73 + 0.27: both stay
    assert set(tokens.tolist()) <= allowed, tokens.tolist()


@pytest.mark.parametrize("top_k,top_p", [(1, 1.0), (-1, 1e-6)])
def test_only_the_argmax_is_drawn_when_the_filter_keeps_one_token(top_k, top_p) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    tokens = _draws(logits, HIT_ROWS + list(range(8)), top_k=top_k, top_p=top_p)
    assert tokens.tolist() == [logits.argmax().item()] * 16


def _nucleus_size(logits: torch.Tensor, top_p: float) -> int:
    """Exact: the smallest set of most likely tokens whose probability reaches top_p (float64, summed from the top)."""
    probs = logits.double().softmax(-1).sort(descending=True).values
    p = torch.tensor(top_p, dtype=torch.float32).double()  # the sampler holds top_p in float32
    return int(((probs.cumsum(0) - probs) < p).sum())


def test_top_p_keeps_exactly_the_nucleus_and_top_p_1_keeps_every_top_k_token() -> None:
    logits = 5.0 * torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    for k in (150_000, 20_000):
        kept = _apply_top_k_top_p(logits, torch.tensor([k]), torch.tensor([1.0]))
        assert int(torch.isfinite(kept).sum()) == k
        assert torch.equal(torch.isfinite(kept[0]), logits[0] >= logits[0].topk(k).values[-1])
    for top_p in (0.9, 0.999, 0.99999):
        kept = _apply_top_k_top_p(logits, torch.tensor([-1]), torch.tensor([top_p]))
        assert int(torch.isfinite(kept).sum()) == _nucleus_size(logits[0], top_p), top_p
