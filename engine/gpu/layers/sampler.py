"""Token sampling: greedy, temperature, top-k and top-p, with optional per-request seeds.

A row samples ``argmax(filter(logits / T) + G)`` where ``G`` is Gumbel noise (the Gumbel-max trick:
this draws from ``softmax(filter(logits / T))`` without a softmax or a cumulative sum); a row with
temperature 0 takes the plain argmax.

The noise is counter-based, not drawn from a generator: element ``v`` of a row gets the bits
``mix32(mix32(v) ^ key)``, and the row's ``key`` mixes three 32-bit words. A seeded request's words are
its seed's halves and the number of tokens it has generated, so its draws depend on nothing else: not
on its batch, its row, a preemption, nor on which path sampled it. Unseeded rows use a per-step value
from the runner's own random stream and their row. Nothing is kept per request, and on CUDA one pass
of a Triton kernel over the logits samples every row (``sampling_kernels``), where the torch path
below made about ten passes. Top-k and top-p become a floor per row there (the smallest logit they keep),
found by a search over the row's values without sorting it (``filter_floors``); the torch path sorts, and
both keep the same tokens except where logits tie at the top_p boundary (the sort splits the tie, the floor
keeps it whole) or a token's mass sits on the boundary within float32 rounding (summed in another order).
Small batches with filters still sort, which is faster there (``SORT_MAX_ROWS``).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.core.sampling_params import may_stop

MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so a 32-bit value times one fits an int64 in torch (and in Triton's
# int64 arithmetic, which the kernel uses for the same reason: both compute the very same bits).
MIX_M1 = 0x7FEB352D
MIX_M2 = 0x4C9F6B5B
# The uniform draws are (m + 0.5) / 2**23 for the top 23 bits m of a hash: every one is exact in float32 (24-bit
# significand), so it lies strictly inside (0, 1). With 24 bits, m + 0.5 needs 25: (2**24 - 1) + 0.5 rounded up to
# 2**24, u to 1.0 and the noise to +inf, so one token in 2**24 won whatever its logit (about 1 % of the rows of a
# 151936-token vocabulary drew a uniformly random token, even under top_k=1, where -inf + inf is a NaN argmax takes).
UNIT_23 = 1.0 / (1 << 23)
_CPU = torch.device("cpu")


def mix32(x: torch.Tensor) -> torch.Tensor:
    """An integer hash of 32-bit values held in int64 (xor-shift-multiply rounds); same bits as the kernel's."""
    x = x ^ (x >> 16)
    x = (x * MIX_M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * MIX_M2) & MASK32
    return x ^ (x >> 16)


def row_keys(words: torch.Tensor) -> torch.Tensor:
    """[rows, 3] int64 words (each in [0, 2**32)) -> [rows] int64 keys."""
    return mix32(mix32(mix32(words[:, 0]) ^ words[:, 1]) ^ words[:, 2])


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows] keys -> [rows, vocab] float32 Gumbel noise, -log(-log(u)), u = (m + 0.5) / 2**23 (finite: UNIT_23)."""
    vocab = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)
    bits = mix32(mix32(vocab).unsqueeze(0) ^ keys.unsqueeze(1))
    uniform = ((bits >> 9).to(torch.float32) + 0.5) * UNIT_23
    return -torch.log(-torch.log(uniform))


class SamplingTensors:
    """Per-row sampling options for one step, built once on the host.

    ``words``: per row [seed low half, seed high half, tokens generated so far] for seeded rows, and
    [this step's random value, row, 2**32 - 1] for the others (a counter no seeded request reaches).
    """

    def __init__(
        self,
        temperatures: list[float],
        top_ks: list[int],
        top_ps: list[float],
        words: list[tuple[int, int, int]],
        device: torch.device,
        filtered_rows: list[int] | None = None,
        masked: tuple[list[int], list[int]] | None = None,
    ) -> None:
        """``filtered_rows``: the rows with top-k or top-p, when the caller knows them (else read off the lists).
        ``masked``: (rows, token ids), the logits that are -inf this step (SamplingRows.unstoppable), or None."""
        self.num_rows = len(temperatures)
        self.all_greedy = not any(temperatures)
        pinned = device.type == "cuda"
        self.masked = None if masked is None else tuple(
            _to(torch.from_numpy(np.array(part, dtype=np.int64)), device, pinned) for part in masked)
        if self.all_greedy:  # argmax alone: nothing else to copy
            self.filtered_rows = []
            return
        self.filtered_rows = _filtered_rows(top_ks, top_ps) if filtered_rows is None else filtered_rows
        # Through numpy: torch.tensor(list) is several times slower on the few hundred rows of a step.
        self.temperatures = _to(torch.from_numpy(np.array(temperatures, dtype=np.float32)), device, pinned)
        # A copy: the caller may reuse its array for the next step while this one is still being copied.
        self.words = _to(torch.from_numpy(np.array(words, dtype=np.int64).reshape(-1, 3)), device, pinned)
        self.top_ks = self.top_ps = None
        if self.filtered_rows:
            self.top_ks = _to(torch.from_numpy(np.array(top_ks, dtype=np.int64)), device, pinned)
            self.top_ps = _to(torch.from_numpy(np.array(top_ps, dtype=np.float32)), device, pinned)

    @classmethod
    def greedy(cls, num_rows: int, device: torch.device = _CPU,
               masked: tuple[list[int], list[int]] | None = None) -> SamplingTensors:
        return cls([0.0] * num_rows, [], [], [], device, masked=masked)


class SamplingRows:
    """The sampled rows' options on the host, read off their sequences once; ``tensors`` copies them to
    the device for one step and ``advanced`` gives the same rows one token later (seeded counters + 1, and the
    min_tokens masks of the token after this one).

    ``unstoppable``: the rows whose token this step may not stop them (SamplingParams.min_tokens), each
    (row, the number of the token it samples counted from 1, its min_tokens, the token ids masked: the engine's eos
    ids, even under ignore_eos as vLLM masks them, and its stop_token_ids). The count is the rows' own, carried by
    ``advanced``: a step launched ahead (ModelRunner.RanAhead) samples before the host has seen the token of the
    step before, and its sequences' lengths are one token short."""

    def __init__(self, seqs, vocab_size: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        params = [seq.sampling_params for seq in seqs]
        self.temperatures = [p.temperature for p in params]
        self.unstoppable = _unstoppable_rows(seqs, params, eos_token_ids, vocab_size)
        self.all_greedy = not any(self.temperatures)
        if self.all_greedy:
            return
        # k past the vocabulary keeps every token: off, like k <= 0 (and a huge k must not reach an int64 tensor)
        self.top_ks = [p.top_k if 0 < p.top_k < vocab_size else -1 for p in params]
        self.top_ps = [p.top_p for p in params]
        self.filtered_rows = _filtered_rows(self.top_ks, self.top_ps)  # once: the rows keep their options
        num_rows = len(params)
        words = np.empty((num_rows, 3), dtype=np.int64)
        words[:, 1] = np.arange(num_rows)
        words[:, 2] = MASK32
        self.seeded_rows = [row for row, p in enumerate(params) if p.seed is not None]
        for row in self.seeded_rows:
            seed, seq = params[row].seed, seqs[row]
            words[row] = (seed & MASK32, seed >> 32, seq.num_tokens - seq.num_prompt_tokens)
        self.words = words

    def advanced(self) -> SamplingRows:
        step = object.__new__(SamplingRows)
        step.temperatures, step.all_greedy = self.temperatures, self.all_greedy
        step.unstoppable = [(row, number + 1, min_tokens, ids) for row, number, min_tokens, ids in self.unstoppable
                            if not may_stop(number + 1, min_tokens)]
        if not self.all_greedy:
            step.top_ks, step.top_ps, step.seeded_rows = self.top_ks, self.top_ps, self.seeded_rows
            step.filtered_rows = self.filtered_rows
            step.words = self.words.copy()
            step.words[self.seeded_rows, 2] += 1
        return step

    def tensors(self, step_value: int, device: torch.device) -> SamplingTensors:
        """This step's tensors; ``step_value`` (32 bits) is the unseeded rows' first word."""
        masked = self._masked()
        if self.all_greedy:
            return SamplingTensors.greedy(len(self.temperatures), device, masked)
        words = self.words
        if not self.seeded_rows:
            words[:, 0] = step_value
        elif len(self.seeded_rows) < len(words):
            unseeded = np.ones(len(words), dtype=bool)
            unseeded[self.seeded_rows] = False
            words[unseeded, 0] = step_value
        return SamplingTensors(self.temperatures, self.top_ks, self.top_ps, words, device, self.filtered_rows, masked)

    def _masked(self) -> tuple[list[int], list[int]] | None:
        """The (row, token id) pairs of ``unstoppable``, as two lists, or None."""
        if not self.unstoppable:
            return None
        rows = [row for row, _, _, ids in self.unstoppable for _ in ids]
        ids = [token for *_, row_ids in self.unstoppable for token in row_ids]
        return rows, ids


def _unstoppable_rows(seqs, params, eos_token_ids: frozenset[int],
                      vocab_size: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """SamplingRows.unstoppable of these rows (an id outside the vocabulary is never sampled: not masked)."""
    rows = []
    masked_ids: dict[frozenset[int], tuple[int, ...]] = {}  # by stop_token_ids: most rows share theirs (none)
    for row, p in enumerate(params):
        if not p.min_tokens:  # (the common case: one attribute read a row)
            continue
        seq = seqs[row]
        number = seq.num_tokens - seq.num_prompt_tokens + 1
        if may_stop(number, p.min_tokens):
            continue
        ids = masked_ids.get(p.stop_token_ids)
        if ids is None:
            ids = masked_ids[p.stop_token_ids] = tuple(
                sorted(t for t in eos_token_ids | p.stop_token_ids if 0 <= t < vocab_size))
        if ids:
            rows.append((row, number, p.min_tokens, ids))
    return rows


def _filtered_rows(top_ks: list[int], top_ps: list[float]) -> list[int]:
    return [row for row, (k, p) in enumerate(zip(top_ks, top_ps)) if k > 0 or p < 1.0]


def _to(host: torch.Tensor, device: torch.device, pinned: bool) -> torch.Tensor:
    if device.type == "cpu":
        return host
    return (host.pin_memory() if pinned else host).to(device, non_blocking=True)


def _apply_top_k_top_p(logits: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    k = torch.where(top_ks > 0, top_ks, vocab).clamp(max=vocab)
    kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p (the top token always stays), i.e. when it and
    # those below it hold at most 1 - top_p, as HF and vLLM test it. Summed from the least likely token up: a float32
    # sum from the top reached 1.0 with tokens left (with top_k 150000 of 151936, top_p 1.0 kept only the first
    # 44212), and top_p 1.0 must keep every token.
    mass_from = probs.flip(-1).cumsum(dim=-1).flip(-1)
    drop = mass_from <= 1.0 - top_ps.unsqueeze(1)
    drop[:, 0] = False  # a top_p that is 0 in float32 (1e-50) would drop the top token too, leaving only -inf
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sample_reference(logits: torch.Tensor, temperatures: torch.Tensor, words: torch.Tensor,
                     top_ks: torch.Tensor | None = None, top_ps: torch.Tensor | None = None) -> torch.Tensor:
    """The torch path: logits [rows, vocab] -> token ids [rows] (int64)."""
    logits = logits.float()
    is_greedy = temperatures == 0.0
    scaled = logits / torch.where(is_greedy, 1.0, temperatures).unsqueeze(1)
    if top_ks is not None and top_ps is not None:
        scaled = _apply_top_k_top_p(scaled, top_ks, top_ps)
    sampled = (scaled + gumbel_noise(row_keys(words), logits.shape[1])).argmax(dim=-1)
    return torch.where(is_greedy, logits.argmax(dim=-1), sampled)


# Up to this many rows a batch with filters sorts. On an H200, 151,936-token vocabulary (benchmarks/sampling.py,
# benchmarks/results/sampling-h200-2026-12-05.json): at 32 rows the sort took 1.5-1.7 ms and the floors (search
# and draw) 1.5-2.2; at 128 rows the sort 4.8 ms and the floors 1.5-2.2. The floors' passes cost the same up to
# one row an SM, the sort grows with the rows; they cross near 50 rows.
SORT_MAX_ROWS = 48


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """logits: [rows, vocab] -> token ids [rows] (int64). ``params.masked`` logits are set to -inf in place first
    (min_tokens, as vLLM's logits processor: before the temperature and the filters, so top-k and top-p keep others)."""
    if params.masked is not None:
        logits[params.masked] = float("-inf")  # on the device, no sync; -inf is never drawn (Gumbel noise is finite)
    if params.all_greedy:
        return logits.argmax(dim=-1)  # the argmax of bf16 values is that of their float32 copies
    filtered = bool(params.filtered_rows)
    if logits.is_cuda:
        from engine.gpu.layers.sampling_kernels import filter_floors, gumbel_argmax

        # Top-k and top-p as a floor per row, found without sorting the rows; no host sync either way.
        if not filtered:
            return gumbel_argmax(logits, params.temperatures, params.words)
        if params.num_rows > SORT_MAX_ROWS:
            floors = filter_floors(logits, params.temperatures, params.top_ks, params.top_ps)
            return gumbel_argmax(logits, params.temperatures, params.words, floors)
    if filtered:  # the reference's filters keep every token of a row without top-k or top-p that could be drawn
        return sample_reference(logits, params.temperatures, params.words, params.top_ks, params.top_ps)
    return sample_reference(logits, params.temperatures, params.words)
