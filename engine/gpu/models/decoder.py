"""A Llama-family decoder: Qwen3 (q/k RMSNorm, no biases), Qwen2 (q/k/v biases), Llama (neither); Llama and Qwen3
with attention_bias have q/k/v/o biases."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.core.model_config import ModelShape
from engine.gpu.attention.metadata import AttentionMetadata
from engine.gpu.layers.activation import SiluAndMul
from engine.gpu.layers.attention import Attention
from engine.gpu.layers.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.gpu.layers.layernorm import RMSNorm
from engine.gpu.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from engine.gpu.layers.rotary_embedding import RotaryEmbedding
from engine.gpu.parallel import ParallelContext


class DecoderAttention(nn.Module):
    def __init__(self, shape: ModelShape, rotary_emb: RotaryEmbedding, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            shape.hidden_size, shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.attention_bias, parallel
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = shape.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # HF's Llama and Qwen3 put attention_bias on o_proj too; Qwen2 biases only q/k/v.
        o_bias = shape.attention_bias and shape.architecture != "Qwen2ForCausalLM"
        self.o_proj = RowParallelLinear(shape.num_heads * shape.head_dim, shape.hidden_size, o_bias, parallel)
        self.rotary_emb = rotary_emb  # the model's one table, shared by every layer
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, backend)
        if shape.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, positions: torch.Tensor, hidden: torch.Tensor, slot_mapping: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """QKV projection, q/k norms and rotary, and the new K/V stored in the cache: the dense half that a
        piecewise CUDA graph captures. Returns the fused [tokens, (Hq + 2 Hkv) * D] rows (``out`` if given)."""
        qkv = self.qkv_proj(hidden, out=out)
        if qkv.is_cuda:  # one fused kernel for q/k norms and rotary, in place
            from engine.gpu.layers.fused_kernels import qk_norm_rope_

            qk_norm_rope_(
                qkv, positions, self.rotary_emb.cos_sin_cache, self.num_heads, self.num_kv_heads, self.head_dim,
                self.q_norm.weight if self.q_norm is not None else None,
                self.k_norm.weight if self.k_norm is not None else None,
                self.q_norm.eps if self.q_norm is not None else 0.0,
            )
            q, k, v = self._split(qkv)
        else:
            q_view, k_view, v = self._split(qkv)
            q, k = q_view, k_view
            if self.q_norm is not None:
                q = self.q_norm(q)
                k = self.k_norm(k)
            q, k = self.rotary_emb(positions, q, k)
            q_view.copy_(q)  # written back so that attention reads every path's q/k from qkv
            k_view.copy_(k)
        self.attn.store(k, v, slot_mapping)
        return qkv

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (q.view(-1, self.num_heads, self.head_dim), k.view(-1, self.num_kv_heads, self.head_dim),
                v.view(-1, self.num_kv_heads, self.head_dim))

    def attend(self, qkv: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention over the paged cache for the step's rows of ``qkv``; [tokens, Hq * D] (``out`` if given).
        Runs eagerly in every mode: its grids follow the step's true decode rows and prefill chunks."""
        q, k, v = self._split(qkv)
        if out is not None:
            out = out.view(-1, self.num_heads, self.head_dim)
        return self.attn.attend(q, k, v, meta, out=out).view(-1, self.q_size)


class DecoderMLP(nn.Module):
    def __init__(self, shape: ModelShape, parallel: ParallelContext) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            shape.hidden_size, [shape.intermediate_size] * 2, False, parallel
        )
        self.down_proj = RowParallelLinear(shape.intermediate_size, shape.hidden_size, False, parallel)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape, rotary_emb: RotaryEmbedding, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(shape, rotary_emb, backend, parallel)
        self.mlp = DecoderMLP(shape, parallel)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def after_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Output projection, residual add and norm, MLP: (MLP output, residual)."""
        hidden = self.self_attn.o_proj(attn_out)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


@dataclass
class StepBuffers:
    """What passes between the pieces of a forward. Eagerly each piece allocates what it writes; under
    piecewise CUDA graphs all four are static buffers of the bucket's size, so the attention that runs
    between two graphs reads and writes addresses the graphs were captured with."""

    residual: torch.Tensor | None = None  # [tokens, hidden], updated in place on CUDA
    qkv: torch.Tensor | None = None  # [tokens, (Hq + 2 Hkv) * D] of the layer about to attend
    attn: torch.Tensor | None = None  # [tokens, Hq * D], that layer's attention output
    hidden: torch.Tensor | None = None  # [tokens, hidden], the final norm's output


class DecoderModel(nn.Module):
    def __init__(self, shape: ModelShape, max_position: int, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(shape.vocab_size, shape.hidden_size, parallel)
        # One cos/sin table for all layers (they are identical): one per layer took num_layers times the memory, 0.6 GB
        # of GPU memory at qwen3-0.6b's 40,960 positions, taken from the KV cache.
        rotary_emb = RotaryEmbedding(shape.head_dim, max_position, shape.rope_theta, shape.rope_scaling)
        self.layers = nn.ModuleList(
            DecoderLayer(shape, rotary_emb, backend, parallel) for _ in range(shape.num_layers)
        )
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def piece(self, k: int, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
              bufs: StepBuffers) -> None:
        """The dense work between attention ``k - 1`` and attention ``k`` (``k`` = 0 .. num_layers): layer k-1's
        output projection and MLP, then layer k's input norm, QKV projection, q/k norm, rotary and KV store
        (writes ``bufs.qkv``); the last piece ends with the final norm (writes ``bufs.hidden``). Written into
        ``bufs``' tensors where they exist, so that a piece can be captured as a CUDA graph."""
        if k == 0:
            embedded = self.embed_tokens(input_ids)
            if bufs.residual is None:
                bufs.residual = embedded
            else:
                bufs.residual.copy_(embedded)
            hidden = self.layers[0].input_layernorm(bufs.residual)
        else:
            hidden, bufs.residual = self.layers[k - 1].after_attention(bufs.attn, bufs.residual)
            if k == len(self.layers):
                bufs.hidden, _ = self.norm(hidden, bufs.residual, out=bufs.hidden)
                return
            hidden, bufs.residual = self.layers[k].input_layernorm(hidden, bufs.residual)
        bufs.qkv = self.layers[k].self_attn.project(positions, hidden, slot_mapping, out=bufs.qkv)

    def attend(self, k: int, meta: AttentionMetadata, bufs: StepBuffers, num_tokens: int) -> None:
        """Layer k's attention for the step's first ``num_tokens`` rows (the rest, if any, are graph padding)."""
        attn = self.layers[k].self_attn.attend(bufs.qkv[:num_tokens], meta,
                                               out=None if bufs.attn is None else bufs.attn[:num_tokens])
        if bufs.attn is None:
            bufs.attn = attn

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Every piece and every attention in turn: the eager path, and what a decode graph captures whole."""
        bufs = StepBuffers()
        num_tokens = input_ids.shape[0]
        for k in range(self.num_pieces):
            self.piece(k, input_ids, positions, meta.slot_mapping, bufs)
            if k < len(self.layers):
                self.attend(k, meta, bufs, num_tokens)  # the buffers are reused by every layer
        return bufs.hidden


class DecoderForCausalLM(nn.Module):
    # HF parameter name fragment -> (our fused parameter, shard id)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, shape: ModelShape, max_position: int, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.shape = shape
        self.model = DecoderModel(shape, max_position, backend, parallel)
        self.lm_head = ParallelLMHead(shape.vocab_size, shape.hidden_size, parallel)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head.compute_logits(hidden)

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]
