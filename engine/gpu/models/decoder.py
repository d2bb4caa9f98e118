"""A Llama-family decoder: Qwen3 (q/k RMSNorm, no biases), Qwen2 (q/k/v biases), Llama (neither)."""

from __future__ import annotations

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
    def __init__(self, shape: ModelShape, max_position: int, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(
            shape.hidden_size, shape.head_dim, shape.num_heads, shape.num_kv_heads, shape.attention_bias, parallel
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.head_dim = shape.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(shape.num_heads * shape.head_dim, shape.hidden_size, False, parallel)
        self.rotary_emb = RotaryEmbedding(shape.head_dim, max_position, shape.rope_theta, shape.rope_scaling)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, backend)
        if shape.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, shape.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        if qkv.is_cuda:  # one fused kernel for q/k norms and rotary, in place
            from engine.gpu.layers.fused_kernels import qk_norm_rope_

            qk_norm_rope_(
                qkv, positions, self.rotary_emb.cos_sin_cache, self.num_heads, self.num_kv_heads, self.head_dim,
                self.q_norm.weight if self.q_norm is not None else None,
                self.k_norm.weight if self.k_norm is not None else None,
                self.q_norm.eps if self.q_norm is not None else 0.0,
            )
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if not qkv.is_cuda:
            if self.q_norm is not None:
                q = self.q_norm(q)
                k = self.k_norm(k)
            q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v, meta)
        return self.o_proj(out.view(-1, self.q_size))


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
    def __init__(self, shape: ModelShape, max_position: int, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(shape, max_position, backend, parallel)
        self.mlp = DecoderMLP(shape, parallel)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DecoderModel(nn.Module):
    def __init__(self, shape: ModelShape, max_position: int, backend, parallel: ParallelContext) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(shape.vocab_size, shape.hidden_size, parallel)
        self.layers = nn.ModuleList(
            DecoderLayer(shape, max_position, backend, parallel) for _ in range(shape.num_layers)
        )
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden


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
