"""Prefill and mixed steps as piecewise CUDA graphs: every dense part captured, attention eager between them.

An eager 8,192-token mixed step issued a few hundred kernels per layer's worth of Python; its host
launch time, not the GPU, set the time of every step that carried prefill (issue 16). Here the work
between two attentions (output projection, MLP, norms, QKV projection, q/k norm + rotary, KV store:
``DecoderModel.piece``) is one graph per layer and per token-count bucket, replayed with the step's
tokens padded to the bucket. Attention stays eager, as vLLM's piecewise mode keeps it: its grids follow
the step's real decode rows and prefill chunks (a full graph would need grids sized for the worst case
and padded metadata for every chunk layout), and two kernel launches per layer are cheap.

Padding rows read token 0 at position 0 and carry slot -1, so the KV store skips them; attention only
sees the step's real rows, and the rows past them are never read. Every graph reads and writes static
buffers (``StepBuffers`` views of the largest bucket), so replaying piece k+1 after the eager attention k
sees that attention's output. Graphs are captured largest bucket first into one memory pool shared
with the decode graphs: only one step runs at a time, and each graph's temporaries die inside it.
"""

from __future__ import annotations

import bisect

import torch

from engine.gpu.attention.metadata import AttentionMetadata
from engine.gpu.models.decoder import StepBuffers


def token_buckets(max_tokens: int) -> list[int]:
    """Batched-token sizes to capture: powers of two to 256, then every 256 (at most 256 padding rows, under
    ~3 % of a step past 8,192 tokens), and ``max_tokens`` itself."""
    sizes = [b for b in (16, 32, 64, 128) if b < max_tokens]
    sizes += list(range(256, max_tokens + 1, 256))
    if not sizes or sizes[-1] != max_tokens:
        sizes.append(max_tokens)
    return sizes


class PiecewiseGraphs:
    def __init__(self, model, max_tokens: int, device: torch.device, dtype: torch.dtype) -> None:
        self.model = model.model  # the DecoderModel
        self.sizes = token_buckets(max_tokens)
        self.max_tokens = max_tokens
        shape = model.shape
        attn = self.model.layers[0].self_attn
        # The inputs of a bucket of size n are [ids | positions | slots], 3n int64 at the start of one buffer,
        # so that a step stages them with a single host-to-device copy.
        self.inputs = torch.zeros(3 * max_tokens, dtype=torch.int64, device=device)
        self.buffers = StepBuffers(
            residual=torch.zeros(max_tokens, shape.hidden_size, dtype=dtype, device=device),
            qkv=torch.zeros(max_tokens, attn.q_size + 2 * attn.kv_size, dtype=dtype, device=device),
            attn=torch.zeros(max_tokens, attn.q_size, dtype=dtype, device=device),
            hidden=torch.zeros(max_tokens, shape.hidden_size, dtype=dtype, device=device),
        )
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.pool_bytes = 0

    def bucket(self, num_tokens: int) -> int:
        """The captured size a step of ``num_tokens`` pads to (0: larger than every bucket, run eagerly)."""
        if num_tokens > self.max_tokens:
            return 0
        return self.sizes[bisect.bisect_left(self.sizes, num_tokens)]

    def _views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, StepBuffers]:
        b = self.buffers
        bufs = StepBuffers(residual=b.residual[:size], qkv=b.qkv[:size], attn=b.attn[:size], hidden=b.hidden[:size])
        return self.inputs[:size], self.inputs[size : 2 * size], self.inputs[2 * size : 3 * size], bufs

    @torch.inference_mode()
    def capture(self, pool, device: torch.device) -> None:
        # Each layer's cache views, looked up once (module attribute lookups are slow on the step's path).
        self._caches = [(layer.self_attn.attn.k_cache, layer.self_attn.attn.v_cache) for layer in self.model.layers]
        free_before = torch.cuda.mem_get_info(device)[0]
        for size in reversed(self.sizes):
            ids, positions, slots, bufs = self._views(size)
            self.inputs.zero_()
            slots.fill_(-1)  # the warm-up runs for real: it must store nothing in the cache
            for k in range(self.model.num_pieces):  # warm-up: compiles kernels, sizes cuBLAS workspaces
                self.model.piece(k, ids, positions, slots, bufs)
            graphs = []
            for k in range(self.model.num_pieces):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    self.model.piece(k, ids, positions, slots, bufs)
                graphs.append(graph)
            self.graphs[size] = graphs
            torch.cuda.synchronize(device)
        self.pool_bytes = max(0, free_before - torch.cuda.mem_get_info(device)[0])

    def stage(self, host_inputs: torch.Tensor) -> None:
        """Copy a step's staged inputs, [ids | positions | slots] padded to its bucket (padding slots -1)."""
        self.inputs[: host_inputs.numel()].copy_(host_inputs, non_blocking=True)

    def run(self, size: int, num_tokens: int, meta: AttentionMetadata) -> torch.Tensor:
        """Replays the bucket's pieces around eager attention; the final hidden states of the real rows."""
        graphs = self.graphs[size]
        first = self.model.layers[0].self_attn
        q, k, v = first._split(self.buffers.qkv[:num_tokens])
        out = self.buffers.attn[:num_tokens].view(-1, first.num_heads, first.head_dim)
        attn = first.attn
        # The same rows, metadata and output for every layer: the launches are prepared once per step.
        attend = attn.backend.per_layer(q, k, v, meta, attn.scale, out, attn.k_cache, attn.v_cache)
        graphs[0].replay()
        for i, (k_cache, v_cache) in enumerate(self._caches):
            attend(k_cache, v_cache)
            graphs[i + 1].replay()
        return self.buffers.hidden[:num_tokens]
