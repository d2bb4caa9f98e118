"""Linear layers that shard across tensor-parallel ranks.

Column-parallel layers split the output features (no communication); row-parallel layers split the
input features and all-reduce their partial sums. Fused layers (QKV, gate/up) load each HF matrix
into its slice of the fused weight through ``weight_loader``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.gpu.parallel import SINGLE, ParallelContext, divide


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, parallel: ParallelContext) -> None:
        super().__init__()
        self.parallel = parallel
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T (+ b)``; into ``out`` when given (a piecewise CUDA graph's static buffer): the same GEMM
        as ``F.linear``, which calls ``mm`` / ``addmm`` for 2-D inputs."""
        if out is None:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return torch.mm(x, self.weight.t(), out=out)
        return torch.addmm(self.bias, x, self.weight.t(), out=out)


class ColumnParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, parallel: ParallelContext = SINGLE):
        super().__init__(in_features, divide(out_features, parallel.world_size, "output features"), bias, parallel)

    def weight_loader(self, param, loaded, shard_id=None):
        size = param.shape[0]
        param.data.copy_(loaded.narrow(0, self.parallel.rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices in one (gate and up): shard ``i`` of each rank sits side by side."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False,
                 parallel: ParallelContext = SINGLE):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias, parallel)

    def weight_loader(self, param, loaded, shard_id=None):
        tp = self.parallel.world_size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.parallel.rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections fused; each rank holds its query heads and its KV heads."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        parallel: ParallelContext = SINGLE,
    ):
        tp = parallel.world_size
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp, "attention heads")
        self.num_kv_heads = divide(num_kv_heads, tp, "KV heads")
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias, parallel)

    def weight_loader(self, param, loaded, shard_id=None):
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        offset, size = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.parallel.rank * size, size))


class RowParallelLinear(LinearBase):
    def __init__(self, in_features: int, out_features: int, bias: bool = False, parallel: ParallelContext = SINGLE):
        super().__init__(divide(in_features, parallel.world_size, "input features"), out_features, bias, parallel)

    def weight_loader(self, param, loaded, shard_id=None):
        if param.dim() == 1:  # the bias is added once, after the reduction
            param.data.copy_(loaded)
            return
        size = param.shape[1]
        param.data.copy_(loaded.narrow(1, self.parallel.rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.parallel.rank == 0 else None
        return self.parallel.all_reduce(F.linear(x, self.weight, bias))
