"""One pass over the logits that samples every row: Gumbel-max with the counter-based noise of ``sampler``.
Rows with top-k or top-p first get a floor (one program per row, a search over the floats' order, no sort), and
the pass skips the logits below it.

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
    Logits, Temperatures, Words, Floors, BestValues, BestIndices, stride_row, vocab_size,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_FLOORS: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature = tl.load(Temperatures + row)
    if HAS_FLOORS:  # divided as the logits are: a token is kept when its scaled value is, as in the reference
        floor = tl.math.div_rn(tl.load(Floors + row), temperature)  # unused by greedy rows (temperature 0)
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
            scaled = tl.math.div_rn(x, temperature)
            x = scaled + noise
            if HAS_FLOORS:
                x = tl.where(scaled >= floor, x, float("-inf"))
        x = tl.where(mask, x, float("-inf"))
        better = x > best  # strict: an earlier index keeps a tie
        best = tl.where(better, x, best)
        best_index = tl.where(better, index, best_index)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_index, 2147483647), axis=0)
    tl.store(BestValues + row * NUM_CHUNKS + chunk, top)
    tl.store(BestIndices + row * NUM_CHUNKS + chunk, first)


@triton.jit
def _ordered(x):
    """float32 -> an int64 that orders as the float does (negative floats' magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _from_ordered(key):
    bits = key.to(tl.int32)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.float32, bitcast=True)


@triton.jit
def _last_reaching(base, vocab_size, lo, hi, target, top, scale, MASS: tl.constexpr, BLOCK: tl.constexpr,
                   PIVOTS: tl.constexpr):
    """The largest key T in [lo, hi] whose logits at or above it weigh at least ``target`` (weight: 1 a logit, or
    with MASS its exp((x - top) / T) as exp2 of (x - top) * scale), given that lo's do. Each round is one pass
    over the row that weighs PIVOTS pivots spread over [lo, hi] at once and narrows the range to the keys of the
    logits between the last pivot that still reaches ``target`` and the next one: T is the key of a logit, and a
    range holding one key ends the search (a few rounds, at most 8 for 32-bit keys)."""
    j = tl.arange(0, PIVOTS)
    while lo < hi:
        span = hi - lo + 1
        pivots = lo + (span * j) // PIVOTS
        ends = lo + (span * (j + 1)) // PIVOTS  # each pivot's range: [pivot, end)
        if MASS:
            weight = tl.zeros([PIVOTS], tl.float32)
        else:
            weight = tl.zeros([PIVOTS], tl.int32)
        first = tl.full([PIVOTS], 2**40, tl.int64)
        last = tl.full([PIVOTS], -(2**40), tl.int64)
        for start in range(0, vocab_size, BLOCK):
            index = start + tl.arange(0, BLOCK)
            valid = index < vocab_size
            x = tl.load(base + index, mask=valid, other=float("-inf")).to(tl.float32)
            key = tl.where(valid, _ordered(x), -(2**40))[None, :]
            reach = key >= pivots[:, None]
            if MASS:
                w = tl.exp2((x - top) * scale)[None, :]
                weight += tl.sum(tl.where(reach, w, 0.0), axis=1)
            else:
                weight += tl.sum(reach.to(tl.int32), axis=1)
            inside = reach & (key < ends[:, None])
            first = tl.minimum(first, tl.min(tl.where(inside, key, 2**40), axis=1))
            last = tl.maximum(last, tl.max(tl.where(inside, key, -(2**40)), axis=1))
        chosen = tl.max(tl.where(weight >= target, j, -1), axis=0)  # >= 0: the first pivot (lo) reaches it
        lo = tl.max(tl.where(j == chosen, first, -(2**40)), axis=0)
        hi = tl.max(tl.where(j == chosen, last, -(2**40)), axis=0)
    return lo


@triton.jit
def _filter_floor_kernel(Logits, Temperatures, TopKs, TopPs, Floors, stride_row, vocab_size, BLOCK: tl.constexpr,
                         PIVOTS: tl.constexpr):
    """One program per row: the smallest logit its top-k and top-p keep (-inf: every one), searched over the
    floats' order (``_last_reaching``), so no row is sorted. Top-k: the k-th largest logit (ties with it stay, as in
    the reference). Top-p: the largest v such that the kept logits at or above v hold at least top_p of the
    probability (the smallest set that does, a run of equal logits whole); the probabilities are those of the
    top-k survivors at the row's temperature, as the reference computes them, summed in another order."""
    row = tl.program_id(0)
    temperature = tl.load(Temperatures + row)
    top_k = tl.load(TopKs + row)
    top_p = tl.load(TopPs + row)
    base = Logits + row * stride_row
    use_k = (top_k > 0) & (top_k < vocab_size)
    use_p = top_p < 1.0
    largest = tl.full([BLOCK], float("-inf"), tl.float32)
    smallest = tl.full([BLOCK], float("inf"), tl.float32)
    for start in range(0, vocab_size, BLOCK):
        index = start + tl.arange(0, BLOCK)
        x = tl.load(base + index, mask=index < vocab_size, other=float("-inf")).to(tl.float32)
        largest = tl.maximum(largest, x)
        smallest = tl.minimum(smallest, tl.where(index < vocab_size, x, float("inf")))
    top = tl.max(largest, axis=0)
    floor = _ordered(tl.min(smallest, axis=0))
    scale = 1.4426950408889634 / temperature  # exp((x - top) / T) as exp2; unused by greedy rows
    if temperature > 0:
        if use_k:
            floor = _last_reaching(base, vocab_size, floor, _ordered(top), top_k, top, scale, False, BLOCK, PIVOTS)
        if use_p:
            total = 0.0
            for start in range(0, vocab_size, BLOCK):
                index = start + tl.arange(0, BLOCK)
                x = tl.load(base + index, mask=index < vocab_size, other=float("-inf")).to(tl.float32)
                kept = (_ordered(x) >= floor) & (index < vocab_size)
                total += tl.sum(tl.where(kept, tl.exp2((x - top) * scale), 0.0), axis=0)
            # (a top_p that rounds to 0 in float32 reaches at the top logit: that alone, as in the reference)
            floor = _last_reaching(base, vocab_size, floor, _ordered(top), top_p * total, top, scale, True, BLOCK,
                                   PIVOTS)
    unfiltered = (temperature <= 0) | ((top_k <= 0) | (top_k >= vocab_size)) & (top_p >= 1.0)
    tl.store(Floors + row, tl.where(unfiltered, float("-inf"), _from_ordered(floor)))


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
_floor_kernel = BoundKernel(_filter_floor_kernel)
# The search's shape, the fastest of benchmarks/sampling.py --floor-configs on an H200 (151,936-token vocabulary;
# benchmarks/results/sampling-h200-2026-12-05.json): 4 pivots a pass over 2048-token blocks took 1.4-2.1 ms for
# 32 and 128 filtered rows, where 16 pivots over 1024 took 3.3-5.4 (more pivots save passes but compare every
# value with each pivot). One program per row: up to 128 rows 8 warps were fastest, at 256 rows (two programs an
# SM) 4 warps (3.3 ms against 4.3 for Qwen3's defaults).
FLOOR_BLOCK = 2048
FLOOR_PIVOTS = 4
FLOOR_WIDE_ROWS = 128


def floor_warps(rows: int) -> int:
    return 8 if rows <= FLOOR_WIDE_ROWS else 4


def filter_floors(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, *,
                  pivots: int = FLOOR_PIVOTS, block: int = FLOOR_BLOCK, num_warps: int | None = None) -> torch.Tensor:
    """logits [rows, vocab], temperatures [rows] float32, top_ks [rows] int64 (<= 0 or >= vocab: off), top_ps
    [rows] float32 (>= 1: off) -> [rows] float32: the smallest logit each row's filters keep (-inf: no filter,
    or a greedy row), for ``gumbel_argmax``'s ``floors``. ``pivots``, ``block``, ``num_warps``: the search's
    shape (benchmarks/sampling.py --floor-configs times others; ``num_warps`` None: by the number of rows)."""
    rows, vocab_size = logits.shape
    floors = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        _floor_kernel((rows,), (logits, temperatures, top_ks, top_ps, floors, logits.stride(0), vocab_size),
                      {"BLOCK": block, "PIVOTS": pivots},
                      num_warps=floor_warps(rows) if num_warps is None else num_warps)
    return floors


def gumbel_argmax(logits: torch.Tensor, temperatures: torch.Tensor, words: torch.Tensor,
                  floors: torch.Tensor | None = None) -> torch.Tensor:
    """logits [rows, vocab] (any float dtype, unit stride in vocab), temperatures [rows] float32 (0: greedy),
    words [rows, 3] int64 -> token ids [rows] int64. ``floors`` [rows] float32: a sampled row draws only among
    the logits at or above its floor (after both are divided by its temperature), as ``filter_floors`` finds
    them for top-k and top-p."""
    rows, vocab_size = logits.shape
    chunk = min(CHUNK_TOKENS, triton.next_power_of_2(vocab_size))
    block = min(BLOCK_TOKENS, chunk)
    num_chunks = triton.cdiv(vocab_size, chunk)
    best_values = torch.empty((rows, num_chunks), dtype=torch.float32, device=logits.device)
    best_indices = torch.empty((rows, num_chunks), dtype=torch.int32, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    has_floors = floors is not None
    _chunk_kernel((rows, num_chunks), (logits, temperatures, words, floors if has_floors else temperatures,
                                       best_values, best_indices, logits.stride(0), vocab_size),
                  {"NUM_CHUNKS": num_chunks, "CHUNK": chunk, "BLOCK": block, "HAS_FLOORS": has_floors}, num_warps=4)
    _pick_kernel((rows,), (best_values, best_indices, out),
                 {"NUM_CHUNKS": num_chunks, "CHUNKS_PAD": triton.next_power_of_2(num_chunks)}, num_warps=1)
    return out
