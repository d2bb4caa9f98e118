"""Predicts how long one engine step takes on a GPU, from the batch the scheduler formed.

``RooflineCostModel`` is the analytic estimate used until measured profiles exist for a model/GPU
pair: each part of the step costs the larger of its FLOPs over the achievable matmul rate and its
bytes over the achievable bandwidth, plus fixed per-step and per-sequence overheads. Every constant
is in ``RooflineConstants`` with the reason for its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.core.model_config import ModelShape
from engine.core.scheduler import ScheduledBatch
from sim.hardware import GPUSpec


class CostModel(Protocol):
    name: str  # "roofline-estimate" or a measured profile's name

    def step_time_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> float:
        """Seconds for the step; ``host_slowdown`` scales the host-bound part (None: the model's own default)."""
        ...

    # Optional: decode_run_s(batch, host_slowdown) -> numpy array | None, step_time_s over a run of decode steps
    # whose batch carries decode_context_tokens and max_decode_context_tokens as arrays (sim.runner uses it for
    # quiet windows when present; without it the runner calls step_time_s once per step); a new array, which the
    # runner sums in place. A run's steps are numbered from batch.step_index (the first one's, an int from
    # sim.runner; an array of them is taken too). Optional too: decode_run_from_s(batch, num_steps, host_slowdown),
    # the same prices from a batch whose contexts are the run's first step's scalars (the model builds the arrays it
    # reads; sim.runner prefers it), and for_replica(index) -> CostModel, the model replica ``index`` prices its
    # steps with (a model whose per-step noise must differ between replicas, sim.bands).


@dataclass(frozen=True)
class RooflineConstants:
    """Efficiencies are fractions of the GPU's measured (else datasheet) peaks.

    Fitted to this engine's measured profiles over a grid of decode, prefill and mixed batches and steps sampled from
    simulated ShareGPT replays (``python validation/roofline_fit.py``: validation/results/roofline-fit.json): a GPU
    with profiles gets its own fit (FITTED_CONSTANTS), any other these defaults, the fit on all four profiles
    (sim/profiles/h200 and h100, qwen3-0.6b and qwen3-8b); the comments give the range of the per-GPU fits. The leads
    they replace, taken from other engines' kernels (KV read at 0.7 of bandwidth, every step paying 1.5 ms of host
    work), priced qwen3-8b's repeating decode steps 1.38x the H200 profile's on average (up to 1.46x) and a ShareGPT
    replay's TPOT at 2.2x.
    """

    # Dense GEMMs at prefill sizes: 0.56-0.74 of the rate (the H200's measured 790 TFLOP/s, the H100's datasheet 989);
    # small-M decode GEMMs are bandwidth-bound anyway.
    matmul_efficiency: float = 0.653
    # Weight streaming in decode GEMMs: 0.90-1.04 of the bandwidth (the H200's measured copy figure, 4.24 TB/s, is
    # below what reads alone reach).
    weight_bandwidth_efficiency: float = 0.959
    # Paged decode attention's KV reads (the engine's split-KV kernel): 0.83-0.92 of the bandwidth.
    kv_bandwidth_efficiency: float = 0.85
    # Prefill attention (the engine's Triton kernel, ~330-425 TFLOP/s on causal chunks): 0.41-0.52 of the matmul rate.
    attention_flops_efficiency: float = 0.454
    # Host side of a step the engine could not prepare during the one before (a prefill or mixed step, or a decode
    # step whose batch changed): scheduling, input preparation, launch or graph replay, sampling, output handling.
    step_overhead_s: float = 0.00164
    # ... and of a decode step that repeats the batch before it (``ScheduledBatch.continues_batch``), which the
    # engine plans while the previous step runs (run-ahead): the replay and the token read-back that remain.
    continuing_step_overhead_s: float = 0.0004
    # Per-sequence host work (slot mapping, block tables, detokenization-free output handling).
    per_seq_overhead_s: float = 1.03e-06
    # Per-layer kernel launch latency floor (norm, qkv, rope, attention, o-proj, mlp kernels), graph-replayed.
    per_layer_overhead_s: float = 2.42e-05
    # Kernels run one after another, so a step's compute-bound parts (matmuls, prefill attention) and memory-bound
    # parts (weight streaming, KV reads) add up. True prices a step at the larger of its FLOP time and its byte time,
    # the bound of an engine that overlapped them perfectly (benchmarks/serving_ceiling.py: a ceiling, not a
    # prediction of any engine here).
    overlap_compute_and_memory: bool = False


# Each GPU this engine was profiled on gets the constants fitted to its own two profiles (validation/roofline_fit.py,
# "fitted"); another GPU gets RooflineConstants(), the fit on all four. On three llama-3.1-8b runs on an H100 (a model
# with no profile) the H100's own fit comes closer than the fit on all four ("gpu_runs_mean_abs_error_pct":
# validation/results/llama-h100-session48).
FITTED_CONSTANTS: dict[str, RooflineConstants] = {
    "h200": RooflineConstants(matmul_efficiency=0.74, weight_bandwidth_efficiency=1.04, kv_bandwidth_efficiency=0.918,
                              attention_flops_efficiency=0.515, step_overhead_s=0.00165,
                              continuing_step_overhead_s=0.000458, per_seq_overhead_s=1.62e-06,
                              per_layer_overhead_s=2.44e-05),
    "h100": RooflineConstants(matmul_efficiency=0.555, weight_bandwidth_efficiency=0.897, kv_bandwidth_efficiency=0.825,
                              attention_flops_efficiency=0.408, step_overhead_s=0.00161,
                              continuing_step_overhead_s=0.000321, per_seq_overhead_s=2.39e-06,
                              per_layer_overhead_s=2.53e-05),
}


def roofline_constants_for(gpu_name: str) -> RooflineConstants:
    """The roofline's constants on ``gpu_name``: fitted to that GPU's profiles where it has some, else the default."""
    return FITTED_CONSTANTS.get(gpu_name, RooflineConstants())


class RooflineCostModel:
    name = "roofline-estimate"

    def __init__(
        self,
        model: ModelShape,
        gpu: GPUSpec,
        tensor_parallel_size: int = 1,
        dtype_bytes: int = 2,
        constants: RooflineConstants | None = None,  # None: roofline_constants_for(gpu.name)
    ) -> None:
        self.model = model
        self.gpu = gpu
        self.constants = c = roofline_constants_for(gpu.name) if constants is None else constants
        tp = tensor_parallel_size
        flops = gpu.bf16_flops
        bw = gpu.bandwidth_bps
        self._matmul_flops_per_token = 2.0 * model.num_layers * model.num_layer_params / tp
        self._lm_head_flops_per_token = 2.0 * model.hidden_size * model.vocab_size / tp
        self._weight_time_s = model.weight_bytes(dtype_bytes, tp) / (bw * c.weight_bandwidth_efficiency)
        self._matmul_rate = flops * c.matmul_efficiency
        self._kv_bytes_per_token = model.kv_bytes_per_token(dtype_bytes, tp)
        self._kv_rate = bw * c.kv_bandwidth_efficiency
        # QK^T and PV: 2 matmuls of 2*head_dim FLOPs per (query, key) pair per head per layer.
        self._attn_flops_per_pair = 4.0 * model.num_layers * (model.num_heads // tp) * model.head_dim
        self._attn_rate = flops * c.attention_flops_efficiency
        self._fixed_s = c.step_overhead_s + c.per_layer_overhead_s * model.num_layers
        self._continuing_fixed_s = c.continuing_step_overhead_s + c.per_layer_overhead_s * model.num_layers

    def step_time_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> float:
        num_tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        num_sampled = batch.num_decode_seqs + batch.num_prefill_seqs
        matmul_s = (num_tokens * self._matmul_flops_per_token + num_sampled * self._lm_head_flops_per_token) / (
            self._matmul_rate
        )
        attention_flops_s = prefill_kv_s = 0.0
        if batch.num_prefill_seqs:
            attention_flops_s = batch.prefill_attention_pairs * self._attn_flops_per_pair / self._attn_rate
            prefill_kv_s = (batch.prefill_context_tokens + batch.num_prefill_tokens) * self._kv_bytes_per_token / (
                self._kv_rate
            )
        decode_kv_s = batch.decode_context_tokens * self._kv_bytes_per_token / self._kv_rate
        host_s = ((self._continuing_fixed_s if batch.continues_batch else self._fixed_s)
                  + self.constants.per_seq_overhead_s * len(batch.seqs))
        if host_slowdown is not None:
            host_s *= host_slowdown
        if self.constants.overlap_compute_and_memory:  # contexts are arrays over a decode run: element by element
            return host_s + np.maximum(matmul_s + attention_flops_s, self._weight_time_s + prefill_kv_s + decode_kv_s)
        # Summed in the order the model always summed them: the same floats, so the same outputs as before.
        attention_s = 0.0
        if batch.num_prefill_seqs:
            attention_s += attention_flops_s
            attention_s += prefill_kv_s
        attention_s += decode_kv_s
        return host_s + max(matmul_s, self._weight_time_s) + attention_s

    def decode_run_s(self, batch: ScheduledBatch, host_slowdown: float | None = None):
        """``step_time_s`` of a run of decode-only steps at once (the contexts are arrays, one entry per step): the
        same expression, element by element, so the same floats. Only the run's first step may not repeat the batch
        before it (``continues_batch`` is that step's, sim.runner): such a first step is priced alone, as the step
        loop prices it."""
        if batch.num_prefill_seqs:
            return None
        if batch.continues_batch:
            return self.step_time_s(batch, host_slowdown)
        contexts = batch.decode_context_tokens
        batch.continues_batch = 1
        run_s = self.step_time_s(batch, host_slowdown)
        batch.continues_batch, batch.decode_context_tokens = 0, int(contexts[0])
        run_s[0] = self.step_time_s(batch, host_slowdown)
        batch.decode_context_tokens = contexts
        return run_s


def num_kv_blocks_for(
    model: ModelShape,
    gpu: GPUSpec,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 8192,
    tensor_parallel_size: int = 1,
    dtype_bytes: int = 2,
) -> int:
    """KV blocks that fit beside the weights and the activation peak, as the GPU engine sizes its cache."""
    tp = tensor_parallel_size
    budget = gpu.memory_bytes * gpu_memory_utilization
    weights = model.weight_bytes(dtype_bytes, tp)
    # Activation peak of a forward at max_num_batched_tokens (hidden states, qkv, gate/up) plus CUDA context,
    # cuBLAS workspace and graph pools (~1.5 GiB measured on typical engines).
    per_token = (4 * model.hidden_size + (model.q_size + 2 * model.kv_size) + 2 * model.intermediate_size) // tp
    activations = max_num_batched_tokens * per_token * dtype_bytes + int(1.5 * (1 << 30))
    free = budget - weights - activations
    per_block = model.kv_bytes_per_token(dtype_bytes, tp) * block_size
    if free < per_block:
        # The activations too: a huge --max-num-batched-tokens alone exhausted the memory, and a message naming
        # only the weights (1.1 GiB of 126 usable) did not say why.
        raise ValueError(
            f"{model.name} does not fit on {gpu.name} at gpu_memory_utilization={gpu_memory_utilization} "
            f"(weights {weights / 2**30:.1f} GiB, activations at max_num_batched_tokens={max_num_batched_tokens} "
            f"{activations / 2**30:.1f} GiB, {budget / 2**30:.1f} GiB usable)"
        )
    return int(free // per_block)
