"""One pass over the logits that samples every row: Gumbel-max with the counter-based noise of ``sampler``.

The vocabulary is cut into chunks, one program per (row, chunk), so a small batch still fills the GPU;
each program keeps the best value and its first index, and a second kernel picks each row's best chunk
(ties go to the lowest token id, as ``torch.argmax``'s do). The hash runs in int64 with the same masks
as the torch path, and division and logarithms are correctly rounded (``div_rn``, libdevice ``log``), so
both paths draw the same tokens from the same logits.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from engine.gpu.layers.sampler import MIX_M1, MIX_M2, UNIT_23
from engine.gpu.triton_launch import BoundKernel

CHUNK_TOKENS = 8192
BLOCK_TOKENS = 1024
MIX_M1_C = tl.constexpr(MIX_M1)
MIX_M2_C = tl.constexpr(MIX_M2)
UNIT_23_C = tl.constexpr(UNIT_23)
# Triton's interpreter (the CPU tests of this kernel) has no libdevice; its tl.log is numpy's, exact too.
# On the GPU tl.log is an approximation, hence libdevice there.
EXACT_LOG = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")


@triton.jit
def _log(x):
    if EXACT_LOG:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = (x * MIX_M1_C) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * MIX_M2_C) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _gumbel_argmax_chunk_kernel(
    Logits, Temperatures, Words, BestValues, BestIndices, stride_row, vocab_size,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature = tl.load(Temperatures + row)
    w0 = tl.load(Words + 3 * row)
    w1 = tl.load(Words + 3 * row + 1)
    w2 = tl.load(Words + 3 * row + 2)
    key = _mix32(_mix32(_mix32(w0) ^ w1) ^ w2)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_index = tl.zeros([BLOCK], tl.int32)
    for start in range(0, CHUNK, BLOCK):
        index = chunk * CHUNK + start + tl.arange(0, BLOCK)
        mask = index < vocab_size
        x = tl.load(Logits + row * stride_row + index, mask=mask, other=float("-inf")).to(tl.float32)
        if temperature > 0:
            bits = _mix32(_mix32(index.to(tl.int64)) ^ key)
            uniform = ((bits >> 9).to(tl.float32) + 0.5) * UNIT_23_C  # exact, inside (0, 1): see UNIT_23
            noise = -_log(-_log(uniform))
            x = tl.math.div_rn(x, temperature) + noise
        x = tl.where(mask, x, float("-inf"))
        better = x > best  # strict: an earlier index keeps a tie
        best = tl.where(better, x, best)
        best_index = tl.where(better, index, best_index)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_index, 2147483647), axis=0)
    tl.store(BestValues + row * NUM_CHUNKS + chunk, top)
    tl.store(BestIndices + row * NUM_CHUNKS + chunk, first)


@triton.jit
def _pick_chunk_kernel(BestValues, BestIndices, Out, NUM_CHUNKS: tl.constexpr, CHUNKS_PAD: tl.constexpr):
    row = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS_PAD)
    mask = chunks < NUM_CHUNKS
    values = tl.load(BestValues + row * NUM_CHUNKS + chunks, mask=mask, other=float("-inf"))
    indices = tl.load(BestIndices + row * NUM_CHUNKS + chunks, mask=mask, other=2147483647)
    top = tl.max(values, axis=0)
    # Chunks are in token order and each holds its first best, so the lowest index among the best wins.
    tl.store(Out + row, tl.min(tl.where(values == top, indices, 2147483647), axis=0).to(tl.int64))


_chunk_kernel = BoundKernel(_gumbel_argmax_chunk_kernel)
_pick_kernel = BoundKernel(_pick_chunk_kernel)


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """logits [rows, vocab] (any float dtype, unit stride in vocab), temperatures [rows] float32 (0: greedy),
    words [rows, 3] int64 -> token ids [rows] int64."""
    rows, vocab_size = logits.shape
    chunk = min(CHUNK_TOKENS, triton.next_power_of_2(vocab_size))
    block = min(BLOCK_TOKENS, chunk)
    num_chunks = triton.cdiv(vocab_size, chunk)
    best_values = torch.empty((rows, num_chunks), dtype=torch.float32, device=logits.device)
    best_indices = torch.empty((rows, num_chunks), dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    _chunk_kernel((rows, num_chunks), (logits, temperatures, words, best_values, best_indices, logits.stride(0),
                                       vocab_size),
                  {"NUM_CHUNKS": num_chunks, "CHUNK": chunk, "BLOCK": block}, num_warps=4)
    _pick_kernel((rows,), (best_values, best_indices, out),
                 {"NUM_CHUNKS": num_chunks, "CHUNKS_PAD": triton.next_power_of_2(num_chunks)}, num_warps=1)
    return out
