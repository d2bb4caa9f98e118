"""Many quiet decode steps at once, exactly as the step loop would run them (torch-free).

A step is *quiet* when nothing but decoding happens: no request waits, every running sequence computes
its one next token, none finishes, none is preempted. Then the scheduler's choice is fixed (the same
batch every step), the only events are block-boundary allocations and prefix-cache registrations at
known steps, and a run of such steps can be applied in one pass: the same tokens, token times, blocks
(in the same order, so the same ids and evictions), step-log rows and end time as stepping through
them one by one. The simulator uses this for the long decode stretches that dominate its run time;
the GPU engine never does (its steps must run).

The caller supplies the steps' end times (``step_ends(batch, start_s, max_steps, horizon_s)``, a float64
array: each the previous one plus the runner's own step time for the batch, its contexts one token
longer each step) and a horizon: the window holds only steps that end strictly before it (the next
arrival, which would change the waiting queue).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.core.scheduler import ScheduledBatch


@dataclass(slots=True)
class QuietWindow:
    num_steps: int
    end_s: float  # when the last step of the window ends
    # False: it stopped before a step in which a sequence finishes or takes a block that may not be free
    stopped_by_horizon: bool = True


def plan_quiet_window(
    engine,
    token_id: int,
    step_ends: Callable[[ScheduledBatch, float, int, float], np.ndarray],
    start_s: float,
    horizon_s: float,
    max_steps: int = 1 << 16,
    min_steps: int = 2,
) -> tuple[QuietWindow, np.ndarray, np.ndarray] | None:
    """The quiet steps ``engine`` would take from ``start_s`` (their start and end times, float64 arrays), or None."""
    scheduler = engine.scheduler
    running = scheduler.running
    if scheduler.waiting or not running or len(running) > scheduler.config.max_num_batched_tokens:
        return None
    token_is_eos = token_id in scheduler.eos_token_ids
    tokens_left = max_steps + 1
    context_tokens = longest = 0
    for seq in running:  # runs before most steps of a simulation: kept lean
        num_tokens = len(seq.token_ids)
        if num_tokens - seq.num_computed_tokens != 1:
            return None  # a prompt chunk still to compute: not a decode-only step
        params = seq.sampling_params
        if (token_is_eos and not params.ignore_eos) or (params.stop_token_ids and token_id in params.stop_token_ids):
            return None  # the token would stop it: a finish
        left = seq.max_num_tokens - num_tokens
        if left < tokens_left:
            if left <= min_steps:
                return None  # it finishes within min_steps: too short a window to be worth it
            tokens_left = left
        context_tokens += num_tokens
        if num_tokens > longest:
            longest = num_tokens
    # A sequence finishes in the step that brings it to max_num_tokens; the window ends before that step.
    steps_left = _steps_with_free_blocks(scheduler.block_manager, running, tokens_left - 1)
    if steps_left < min_steps:
        return None
    bs = len(running)
    batch = ScheduledBatch(seqs=running, num_new_tokens=[1] * bs, num_decode_seqs=bs)
    batch.decode_context_tokens = context_tokens
    batch.max_decode_context_tokens = longest
    ends = step_ends(batch, start_s, steps_left, horizon_s)
    if len(ends) < min_steps:
        return None
    starts = np.empty(len(ends))
    starts[0] = start_s
    starts[1:] = ends[:-1]
    return QuietWindow(len(ends), float(ends[-1]), len(ends) < steps_left), starts, ends


def _next_block_step(seq, block_size: int) -> int:
    """The window step at which a decoding ``seq`` takes its next block: when it computes token table * B + 1
    (then every block_size steps)."""
    return max(len(seq.block_table) * block_size - seq.num_computed_tokens, 0)


def _steps_with_free_blocks(block_manager, running, steps: int) -> int:
    """How many of the next ``steps`` decode steps find a free block at every block boundary they cross."""
    if steps <= 0:
        return 0
    block_size = block_manager.block_size
    firsts = [_next_block_step(seq, block_size) for seq in running]
    free = block_manager.num_free_blocks
    if sum((steps - 1 - first) // block_size + 1 for first in firsts if first < steps) <= free:
        return steps
    allocations = sorted(k for first in firsts for k in range(first, steps, block_size))
    return allocations[free]  # the step whose allocation would not fit runs through the step loop


def apply_quiet_window(
    engine, token_id: int, window: QuietWindow, starts: np.ndarray, ends: np.ndarray
) -> None:
    """Advance ``engine`` by the window's steps: what ``window.num_steps`` step-loop iterations would do."""
    scheduler = engine.scheduler
    block_manager = scheduler.block_manager
    running = list(scheduler.running)
    bs = len(running)
    steps = window.num_steps
    block_size = block_manager.block_size
    # Block events in step order, then running order within a step, as the step loop meets them:
    # a new block when a token crosses a boundary, a registration when a block fills.
    events = []
    for index, seq in enumerate(running):
        computed = seq.num_computed_tokens
        events.extend((k, index) for k in range(_next_block_step(seq, block_size), steps, block_size))
        if block_manager.enable_prefix_caching:
            # Full blocks not yet offered to the cache are registered by the first step (k = 0); after
            # that, one block fills every block_size steps.
            registered = seq.num_registered_blocks
            if (computed + 1) // block_size > registered:
                events.append((0, index))
                registered = (computed + 1) // block_size
            first_fill = (registered + 1) * block_size - computed - 1
            events.extend((k, index) for k in range(first_fill, steps, block_size))
    events.sort()
    # Every token of the window first: a block registered mid-window is hashed from the tokens it holds.
    tokens = array("i", [token_id]) * steps  # extends a simulated array('i') prompt by a copy (a list too)
    token_times_s = array("d")
    token_times_s.frombytes(ends.tobytes())  # copies of the buffer, not a walk over floats
    first_end_s = float(ends[0])
    starting = [seq.num_computed_tokens for seq in running]
    for seq in running:
        seq.token_ids.extend(tokens)
        seq.token_times_s.extend(token_times_s)
        if seq.first_token_s is None:  # its first step computed the prompt's last token alone
            seq.first_token_s = first_end_s
    # Blocks in use after each step: constant between events, so written as runs (a step's row counts its events).
    used_after_step = array("q")
    used = block_manager.num_used_blocks
    rows = 0
    for k, seq_index in events:
        if k > rows:
            used_after_step.extend(array("q", [used]) * (k - rows))
            rows = k
        seq = running[seq_index]
        seq.num_computed_tokens = starting[seq_index] + k
        before = len(seq.block_table)
        if not block_manager.append_slots(seq, 1):
            raise RuntimeError("a quiet window ran out of blocks it had counted as free")
        used += len(seq.block_table) - before
    used_after_step.extend(array("q", [used]) * (steps - rows))
    for index, seq in enumerate(running):
        seq.num_computed_tokens = starting[index] + steps
    decode_context = sum(starting) + bs
    longest = max(starting) + 1
    engine.step_log.extend_quiet(bs, decode_context, longest, used_after_step, starts, ends)
