"""Vocabulary-parallel embedding and LM head: each rank owns a contiguous slice of the vocabulary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.gpu.parallel import SINGLE, ParallelContext, divide


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, parallel: ParallelContext = SINGLE) -> None:
        super().__init__()
        self.parallel = parallel
        self.vocab_size = vocab_size
        self.shard_size = divide(vocab_size, parallel.world_size, "vocab size")
        self.vocab_start = parallel.rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        param.data.copy_(loaded.narrow(0, self.vocab_start, self.shard_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.parallel.enabled:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.parallel.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the full vocabulary on rank 0 (None elsewhere), for the positions that sample."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = F.linear(hidden, self.weight)
        return self.parallel.gather_to_first(logits, dim=-1)
