"""RMSNorm, with the residual add fused into the same pass when a residual is given."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dtype) * self.weight

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With ``residual``: (norm(x + residual), x + residual). The result goes to ``out`` when given."""
        if x.is_cuda and x.dim() == 2:
            from engine.gpu.layers.fused_kernels import rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps, out=out)
            return rms_norm(x, self.weight, self.eps, residual, out=out), residual  # residual updated in place
        if residual is None:
            return _into(self._norm(x), out)
        # The residual stream is kept in the activation dtype, as in HF models.
        residual = x + residual
        return _into(self._norm(residual), out), residual


def _into(value: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return value
    return out.copy_(value)
