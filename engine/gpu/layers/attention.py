"""Attention layer: stores the new K/V into this layer's paged cache, then attends through the backend.

The two halves are separate calls because a piecewise CUDA graph captures the store (its slots sit in a
static buffer, padding rows marked -1) while attention itself runs eagerly with the step's true shapes.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.gpu.attention.metadata import AttentionMetadata


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, backend) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend
        # Views into the runner's single KV allocation, bound once it is sized.
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def store(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        self.backend.store(k, v, self.k_cache, self.v_cache, slot_mapping)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
               out: torch.Tensor | None = None) -> torch.Tensor:
        return self.backend.forward(q, k, v, self.k_cache, self.v_cache, meta, self.scale, out=out)
