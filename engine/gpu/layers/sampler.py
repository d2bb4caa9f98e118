"""Token sampling: greedy, temperature, top-k and top-p, with optional per-request seeds.

Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)), which draws from p without a
cumulative sum; rows with a seed draw their noise from their own generator so they are reproducible
whatever else shares the batch.
"""

from __future__ import annotations

import torch


class SamplingTensors:
    """Per-row sampling options for one step, built once on the host."""

    def __init__(
        self,
        temperatures: list[float],
        top_ks: list[int],
        top_ps: list[float],
        generators: list[torch.Generator | None],
        device: torch.device,
    ) -> None:
        self.all_greedy = all(t == 0.0 for t in temperatures)
        self.needs_top_k = any(k > 0 for k in top_ks)
        self.needs_top_p = any(p < 1.0 for p in top_ps)
        self.temperatures = torch.tensor(temperatures, dtype=torch.float32).to(device, non_blocking=True)
        self.top_ks = (torch.tensor(top_ks, dtype=torch.int64).to(device, non_blocking=True)
                       if self.needs_top_k else None)
        self.top_ps = (torch.tensor(top_ps, dtype=torch.float32).to(device, non_blocking=True)
                       if self.needs_top_p else None)
        self.generators = generators
        self.any_seeded = any(g is not None for g in generators)


def _apply_top_k_top_p(logits: torch.Tensor, top_ks: torch.Tensor | None, top_ps: torch.Tensor | None) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_ks is not None:
        k = torch.where(top_ks > 0, top_ks, vocab).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_ps is not None:
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the top token always stays).
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_ps.unsqueeze(1), float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """logits: [rows, vocab] -> token ids [rows] (int64)."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if params.all_greedy:
        return greedy
    temperatures = params.temperatures
    is_greedy = temperatures == 0.0
    scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)
    if params.needs_top_k or params.needs_top_p:
        scaled = _apply_top_k_top_p(scaled, params.top_ks, params.top_ps)
    probs = scaled.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_()
    if params.any_seeded:
        for row, generator in enumerate(params.generators):
            if generator is not None:
                noise[row].exponential_(generator=generator)
    sampled = (probs / noise.clamp_min(1e-20)).argmax(dim=-1)
    return torch.where(is_greedy, greedy, sampled)
