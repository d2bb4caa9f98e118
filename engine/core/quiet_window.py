"""Many quiet decode steps at once, exactly as the step loop would run them (torch-free).

A step is *quiet* when nothing but decoding happens: no request waits, every running sequence computes
its one next token, none is preempted. Then the scheduler's choice is fixed (every running sequence,
in order), the only events are block-boundary allocations and prefix-cache registrations at known
steps, and finishes at known steps (a sequence finishes in the step that brings it to its
``max_num_tokens``; its blocks are freed after the step's allocations, and the batch loses it from the
next step on). A run of such steps can be applied in one pass: the same tokens, token times, blocks (in
the same order, so the same ids and evictions), finishes, step-log rows and end time as stepping through
them one by one. The simulator uses this for the long decode stretches that dominate its run time;
the GPU engine never does (its steps must run).

Requests may wait through a window in which none of them can be admitted (``admits_none``): while the batch does
not change, the scheduler admits none when the running batch is at ``max_num_seqs`` (both policies: admission is
the first thing the nano policy tries, and after the running sequences in the mixed one, each stopped by that
count), or, under the mixed policy, when its decode rows take the whole token budget (``max_num_batched_tokens``;
admission needs some left). Preemption admits none (the window's blocks are free), and a request arriving
only joins the queue's tail. Such a window ends with the step in which its first sequence finishes (the next one
may admit), whatever arrives meanwhile; each of its rows counts the requests waiting after that step
(``QuietRun.waited``).

A window is cut into *segments*: runs of steps with the same batch, each but the last ending in a step
in which some sequence finishes. The caller supplies the steps' end times (``step_ends(batch, start_s,
max_steps, horizon_s, cross_horizon)``, a float64 array: each the previous one plus the runner's own step time
for the batch, its contexts one token longer and its ``step_index`` one higher each step), called once per
segment, and a horizon: the window holds only steps that end strictly before it (the next arrival, which would
change the waiting queue), or with ``cross_horizon`` also the step in progress when it comes (whose end
``step_ends`` then returns as well). The window's step starts and ends are then copied into two array('d'): every
later read of them is of one float at a time (a block event's time, a bisection, a run's first start), which a
numpy array answers with a scalar object each, two to three times the instructions.

Where nobody waits and every running sequence is a steady decode that owes its tokens (engine.core.steady_decodes,
the simulator's large batches), the same window is planned and applied without a pass over the batch
(``_plan_steady``): a steady sequence is filed under the advance of its first event (a block opened or filled, its
finish), so the rows filed under the window's steps are exactly those with an event in it; the batch's context sums
are the bookkeeping's running totals; and the other rows keep owing, the window's steps logged once for them all. Near
capacity (~145 sequences, windows of a few steps) a window then reads a few rows, not all of them several times.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from engine.core.block_manager import decode_steps_to_new_block
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence, index_in_running

_INT32 = 1 << 31  # lazily owed tokens are logged in an array('i') (engine.core.steady_decodes)


@dataclass(slots=True)
class QuietWindow:
    num_steps: int
    end_s: float  # when the last step of the window ends
    # False: it stopped before a step that takes a block that may not be free (or at max_steps, or every
    # sequence finished)
    stopped_by_horizon: bool = True
    # Segment j runs steps [bounds[j], bounds[j + 1]) with the sequences that finish after bounds[j]
    bounds: list[int] = field(default_factory=list)
    # ... whose number, summed contexts and longest context in its first step are batches[j]
    batches: list[tuple[int, int, int]] = field(default_factory=list)
    lefts: list[int] = field(default_factory=list)  # the step (counted from 1) each running sequence finishes in
    continues_first: int = 0  # the first step's ScheduledBatch.continues_batch (a later segment's first step: 0)
    # True: requests wait, and none can be admitted before the window's last step (it ends with the first finish);
    # a request arriving meanwhile only waits (QuietRun.waited), it does not end the window.
    admits_none: bool = False
    # Planned from the scheduler's steady decodes (_plan_steady): the only rows the window handles, those filed
    # under one of its steps (in running order; lefts is theirs); every other one owes the window's tokens. None:
    # planned row by row, every running sequence handled (lefts is the batch's).
    due: list[Sequence] | None = None


def admits_none(scheduler) -> bool:
    """Whether a step of the running batch as it is (all decodes, none preempted) admits no waiting request, as the
    scheduler decides it (engine.core.scheduler, ``_admit_waiting``): the batch is at ``max_num_seqs``, or (mixed
    policy, which admits after the running rows) those rows take the whole token budget. Nothing else stops an
    admission for as long as the batch stays: the head's blocks or tokens may fit at any step."""
    return len(scheduler.running) >= admits_none_from(scheduler.config)


def admits_none_from(config) -> int:
    """The fewest running sequences whose decode-only steps admit no waiting request (``admits_none``): a caller that
    plans windows through waiting requests only for small batches knows from this whether any can form."""
    if config.policy == "mixed":
        return min(config.max_num_seqs, config.max_num_batched_tokens)
    return config.max_num_seqs


def plan_quiet_window(
    engine,
    token_id: int,
    step_ends: Callable[[ScheduledBatch, float, int, float, bool], np.ndarray],
    start_s: float,
    horizon_s: float,
    max_steps: int = 1 << 16,
    min_steps: int = 2,
    cross_horizon: bool = False,
    refusal: list | None = None,
    segment_ends: Callable[[int, int, int, int, float, int, float, bool], np.ndarray | None] | None = None,
) -> tuple[QuietWindow, array, array] | None:
    """The quiet steps ``engine`` would take from ``start_s`` (their start and end times, each an array('d')), or
    None.

    With ``cross_horizon`` the window also holds the step in progress at ``horizon_s`` (it starts before and ends at
    or after it), as the step loop runs it: a request arriving at the horizon waits for that step's end. The caller
    then records the window after the arrival (its last row counts the requests waiting) and avoids an arrival at
    exactly that step's end (which of the two comes first is its event loop's choice).

    With requests waiting, a window only where none can be admitted (``admits_none``): it ends with its first finish
    at the latest, and the caller's horizon is then only the one its event loop needs (arrivals just wait). A caller
    that passes ``refusal`` (a list) learns why such a window was refused when no window can form until a sequence
    finishes or is preempted (one finishes, or a block allocation fails, within ``min_steps``): 'finish' is
    appended.

    ``segment_ends(num_seqs, context_tokens, max_context_tokens, continues_batch, start_s, max_steps, horizon_s,
    cross_horizon)``, if given, is asked first for each segment: ``step_ends`` of the segment's batch given by its
    numbers (its rows, their contexts summed and the longest in its first step, whether that step continues the batch
    before it), the very floats (a float64 array, or an array('d') for a segment summed step by step), or None to be
    asked through ``step_ends`` (a batch built for it)."""
    scheduler = engine.scheduler
    running = scheduler.running
    if not running or len(running) > scheduler.config.max_num_batched_tokens:
        return None
    waiting = bool(scheduler.waiting)
    if waiting:
        if not admits_none(scheduler):
            return None
        newest = running[-1]  # the one most likely still in its prompt (admitted last): one look before the pass
        if len(newest.token_ids) - newest.num_computed_tokens != 1:
            return None
    # (Unsteady rows first, the cheap sign: a batch too small to be filed has them all unsteady.)
    elif (not (steady := scheduler.steady_decodes).unsteady and segment_ends is not None and steady.covers(running)
          and token_id not in scheduler.eos_token_ids and -_INT32 <= token_id < _INT32):
        return _plan_steady(engine, token_id, step_ends, start_s, horizon_s, max_steps, min_steps, cross_horizon,
                            segment_ends)
    scheduler.settle_tokens()  # every row is read below, and a window moves them all (lazy tokens: their debts paid)
    token_is_eos = token_id in scheduler.eos_token_ids
    lefts = []  # the step (counted from 1) in which each sequence finishes
    contexts = []  # tokens each holds now: the first step's context
    for seq in running:  # runs before most steps of a simulation: kept lean
        num_tokens = len(seq.token_ids)
        contexts.append(num_tokens)
        if num_tokens - seq.num_computed_tokens != 1:
            return None  # a prompt chunk still to compute: not a decode-only step
        params = seq.sampling_params
        if (token_is_eos and not params.ignore_eos) or (params.stop_token_ids and token_id in params.stop_token_ids):
            return None  # the token would stop it (unless min_tokens holds it): a finish the window does not model
        lefts.append(seq.max_num_tokens - num_tokens)
    # After the last sequence finishes the batch is empty: the window ends there at the latest; with requests
    # waiting, after the first finish (the step after it may admit one).
    last_step = min(lefts) if waiting else max(lefts)
    steps = _steps_with_free_blocks(scheduler.block_manager, running, lefts, min(max_steps, last_step))
    if steps < min_steps:
        if waiting and refusal is not None and steps < max_steps:
            # Not max_steps: a finish (the window's end) or a block that may not be free comes first, and until then
            # lefts only shrink and blocks are only taken (none is admitted, none finishes).
            refusal.append("finish")
        return None
    bounds = [0]
    for left in sorted(set(lefts)):  # (a loop: a comprehension is a function call of its own)
        if left >= steps:
            break
        bounds.append(left)
    bounds.append(steps)
    batches = []
    # The first step's start, then every step's end (starts and ends are two slices of it), copied in segment by
    # segment: no numpy concatenation or scalar read.
    times = array("d", (start_s,))
    t_s = start_s
    num_steps = 0
    # The first step schedules every running sequence, in order; each later segment's first step has lost the
    # sequences that finished in the step before, so it does not continue that step's batch.
    continues_first = scheduler.continues_last_batch(running)
    first_step_index = engine.step_log.num_rows  # the window's first step is the log's next row
    # The first step's contexts: their number, sum and longest, less those of each segment's finished sequences
    bs, seg_sum, seg_longest = len(contexts), sum(contexts), max(contexts)
    for j in range(len(bounds) - 1):
        first, segment_steps = bounds[j], bounds[j + 1] - bounds[j]
        if j:
            # Segment j has lost the sequences whose left is bounds[j] (they ascend through every left below steps):
            # found in C (count, index), not by a pass over the batch for each segment.
            at, lost_longest = -1, False
            for _ in range(lefts.count(first)):
                at = lefts.index(first, at + 1)
                bs -= 1
                seg_sum -= contexts[at]
                lost_longest = lost_longest or contexts[at] == seg_longest
            if lost_longest:
                seg_longest = max([c for c, left in zip(contexts, lefts) if left > first])
        # Step `first` computes token num_tokens + first of each: its context is that many tokens.
        context, longest = seg_sum + bs * first, seg_longest + first
        batches.append((bs, context, longest))
        ends = None if segment_ends is None else segment_ends(bs, context, longest, 0 if j else continues_first, t_s,
                                                              segment_steps, horizon_s, cross_horizon)
        if ends is None:
            seqs = [seq for seq, left in zip(running, lefts) if left > first] if j else running
            batch = ScheduledBatch(seqs=seqs, num_new_tokens=[1] * bs, num_decode_seqs=bs,
                                   continues_batch=0 if j else continues_first, step_index=first_step_index + first)
            batch.decode_context_tokens, batch.max_decode_context_tokens = context, longest
            ends = step_ends(batch, t_s, segment_steps, horizon_s, cross_horizon)
        times.frombytes(ends.tobytes())
        num_ends = len(ends)
        num_steps += num_ends
        if num_ends < segment_steps or times[-1] >= horizon_s:  # the horizon (the step it falls in, if crossed)
            # The window ends in segment j, or before it where none of its steps came (_cut_segments, inlined: most
            # windows of a trace like Azure's end at the horizon)
            if num_ends:
                del bounds[j + 1:]
            else:
                del bounds[j:], batches[j:]
            bounds.append(num_steps)
            break
        t_s = times[-1]
    if num_steps < min_steps:
        return None
    stopped_by_horizon = num_steps < steps
    window = QuietWindow(num_steps, times[-1], stopped_by_horizon, bounds, batches, lefts, continues_first, waiting)
    return window, times[:-1], times[1:]


def _plan_steady(engine, token_id: int, step_ends, start_s: float, horizon_s: float, max_steps: int, min_steps: int,
                 cross_horizon: bool, segment_ends) -> tuple[QuietWindow, array, array] | None:
    """``plan_quiet_window`` where nobody waits and every running sequence is a steady decode that owes its tokens
    (engine.core.steady_decodes): the same window, found from the rows filed under its steps rather than from every
    row. A steady sequence's first event (a block opened or filled, its finish) is the advance it is filed under, so
    the rows filed under the first ``n`` steps are all those that finish within ``n + 1`` steps or take a block within
    ``n``; the batch's context sums are the bookkeeping's running totals. Each segment is priced up to the end the
    rows read so far give it (the window's step cap where none), then the rows filed under the steps priced are read
    (those steps' events): a finish or an allocation that does not fit among them cuts the priced steps there, as
    a segment priced to it would have ended (the runner's ends are the same floats however a run is split into
    passes); without a horizon, the rows filed before the priced end are read first. So a window of K steps reads the
    rows with an event in its first K + 1 steps, not the batch."""
    scheduler = engine.scheduler
    running = scheduler.running
    steady = scheduler.steady_decodes
    block_manager = scheduler.block_manager
    block_size = block_manager.block_size
    free = block_manager.num_free_blocks
    num_seqs = len(running)
    # What the rows filed under the first `examined` steps say: (steps from now it is filed at, sequence, left) of
    # each; the sequences by the step they finish in (left), those steps ascending; the steps each allocates from and
    # to (a block every block_size steps); the step whose allocation finds no free block, once one is known.
    examined = 0
    filed: list[tuple[int, Sequence, int]] = []
    finishing: dict[int, list[Sequence]] = {}
    finish_steps: list[int] = []
    spans: list[tuple[int, int]] = []
    full_at = math.inf

    def examine(end: int) -> None:
        nonlocal examined, full_at
        if end <= examined:
            return
        for at, seq in steady.filed_within(examined, end):
            computed = seq.num_computed_tokens  # (paid up: its row holds computed + 1 tokens)
            left = seq.max_num_tokens - computed - 1
            filed.append((at, seq, left))
            if left in finishing:
                finishing[left].append(seq)
            else:
                finishing[left] = [seq]
                insort(finish_steps, left)
            first_block = len(seq.block_table) * block_size - computed  # decode_steps_to_new_block, unclamped
            if first_block < left:
                spans.append((first_block if first_block > 0 else 0, left))
        examined = end
        # (_steps_with_free_blocks: allocations before `end` are all known now.) Counted only where they might not
        # fit: a span allocates at most (end - 1) // block_size + 1 times before `end` (from step 0 on), so while the
        # spans times that is within the free blocks, so is their sum (a window of a few steps with 256-token blocks:
        # one allocation a span at most, and the count, a pass over every span at every examine, is skipped).
        if full_at == math.inf and spans and len(spans) * ((end - 1) // block_size + 1) > free:
            num_allocations = 0
            for first, last in spans:
                if first < end:
                    num_allocations += ((last if last < end else end) - 1 - first) // block_size + 1
            if num_allocations > free:
                allocations = sorted(k for first, last in spans for k in range(first, min(last, end), block_size))
                if len(allocations) > free:
                    full_at = allocations[free]

    def segment_end(first: int) -> int:
        """The end of the segment from step ``first`` as far as the rows read tell it: exact where at most examined."""
        at = bisect_right(finish_steps, first)
        end = finish_steps[at] if at < len(finish_steps) else max_steps
        if max_steps < end:  # min(end, max_steps, full_at), without the call
            end = max_steps
        return full_at if full_at < end else end

    # Refused as plan_quiet_window refuses it: fewer than min_steps before the cap, an allocation that may not fit,
    # or every sequence's finish (then all of them are filed within min_steps).
    examine(min(min_steps, max_steps))
    if max_steps < min_steps or full_at < min_steps or (len(filed) == num_seqs and finish_steps[-1] < min_steps):
        return None
    plain_sum, plain_longest = steady.plain_context()  # every row's computed tokens (owed ones counted), summed, max
    bs, seg_sum, seg_longest = num_seqs, plain_sum + num_seqs, plain_longest + 1  # the first step's contexts
    continues_first = scheduler.continues_last_batch(running)
    first_step_index = engine.step_log.num_rows
    times = array("d", (start_s,))
    t_s = start_s
    bounds = [0]
    batches = []
    gone: set[Sequence] = set()  # the sequences finished before the segment
    first = 0
    while True:
        planned_end = segment_end(first)
        if horizon_s == math.inf and planned_end > examined:
            # No horizon: the window runs to its end, every row filed before it read anyway; read first, so the
            # segment is priced to its own end, not to the step cap (4,096 steps, where a finish comes in a few).
            examine(planned_end)
            planned_end = segment_end(first)
        context, longest = seg_sum + bs * first, seg_longest + first
        continues = 0 if first else continues_first
        ends = segment_ends(bs, context, longest, continues, t_s, planned_end - first, horizon_s, cross_horizon)
        if ends is None:
            seqs = [seq for seq in running if seq not in gone] if gone else running
            batch = ScheduledBatch(seqs=seqs, num_new_tokens=[1] * bs, num_decode_seqs=bs, continues_batch=continues,
                                   step_index=first_step_index + first)
            batch.decode_context_tokens, batch.max_decode_context_tokens = context, longest
            ends = step_ends(batch, t_s, planned_end - first, horizon_s, cross_horizon)
        num_ends = len(ends)
        by_horizon = num_ends < planned_end - first or (num_ends > 0 and ends[-1] >= horizon_s)
        reached = first + num_ends
        examine(min(reached + 1, max_steps))  # every finish up to reached + 1, every allocation up to reached
        end = segment_end(first)
        if end < reached:  # a finish or a full cache the priced steps ran past: the segment ends there
            ends = ends[:end - first]
            reached, by_horizon = end, False
        if reached > first:
            times.frombytes(ends.tobytes())
            batches.append((bs, context, longest))
            bounds.append(reached)
        window_end = (reached == max_steps or reached == full_at
                      or (reached == end and bs == len(finishing.get(reached, ()))))
        if by_horizon or window_end:
            break
        # A segment ends in the step its first sequences finish in; the next one runs without them.
        lost = finishing[reached]
        bs -= len(lost)
        lost_longest = False
        for seq in lost:
            seg_sum -= seq.num_computed_tokens + 1
            lost_longest = lost_longest or seq.num_computed_tokens + 1 == seg_longest
        gone.update(lost)
        if lost_longest:
            seg_longest = steady.longest_without(gone) + 1
        first = reached
        t_s = times[-1]
    num_steps = bounds[-1]
    if num_steps < min_steps:
        return None
    # The rows with an event in the window, in running order (as the step loop meets their events): the running list
    # is sorted by running_order (Scheduler._append_running), so sorting by it needs no row's index (a bisection each,
    # ~3,000 instructions, was ~1 % of simulate()'s near capacity).
    due = [(seq.running_order, seq, left) for at, seq, left in filed if at < num_steps]
    due.sort(key=itemgetter(0))
    window = QuietWindow(num_steps, times[-1], not window_end, bounds, batches, [left for _, _, left in due],
                         continues_first, False, [seq for _, seq, _ in due])
    return window, times[:-1], times[1:]


def _cut_segments(bounds: list[int], batches: list, num_steps: int) -> list[int]:
    """The segment bounds of a window ending after its first ``num_steps`` steps (``batches`` is cut to match)."""
    bounds = bounds[:bisect_left(bounds, num_steps)]  # (they ascend)
    bounds.append(num_steps)
    del batches[len(bounds) - 1:]
    return bounds


def _steps_with_free_blocks(block_manager, running, lefts: list[int], steps: int) -> int:
    """How many of the next ``steps`` decode steps find a free block at every block boundary they cross (a
    sequence takes blocks up to the step it finishes in; the blocks finishes free are not counted on, so
    the answer may be short, never long)."""
    if steps <= 0:
        return 0
    block_size = block_manager.block_size
    free = block_manager.num_free_blocks
    # A sequence opens at most one block every block_size of its steps: when that many blocks are free for every
    # sequence, none of the allocations can fail (the common case, decided without reading a sequence).
    if len(running) * ((steps + block_size - 1) // block_size) <= free:
        return steps
    spans = [(decode_steps_to_new_block(seq, block_size), min(left, steps)) for seq, left in zip(running, lefts)]
    if sum((last - 1 - first) // block_size + 1 for first, last in spans if first < last) <= free:
        return steps
    allocations = sorted(k for first, last in spans for k in range(first, last, block_size))
    return allocations[free]  # the step whose allocation would not fit runs through the step loop


class QuietRun:
    """A planned window applied as a clock reaches it, for a simulator whose router reads the replicas mid-window.

    ``advance(t)`` makes the engine's queues and block manager what the step loop's are at time ``t``: every step
    scheduled before ``t`` has taken its blocks and registered its full blocks (a step does so when it is
    scheduled, at its start), and every step that ended before ``t`` has finished its sequences (at its end).
    ``cut(t)`` ends the window after the step in progress at ``t`` (a request arrived: the step after it schedules
    that request; a window that ``admits_none`` is not cut, the request only waits), ``waited(t)`` notes that the
    waiting queue grew at ``t`` (a request joined it: the rows of the steps that end from ``t`` on count it),
    ``stop(t)`` ends it where a stopped simulation leaves it (its steps that ended before ``t``),
    and ``finish()`` applies the rest and writes the window's step-log rows, at the window's end.
    A step that starts or ends exactly at ``t`` is the caller's to avoid: which comes first then depends on
    its event loop's order. The tokens and token times of the whole window are appended up front (a cut takes
    back those of the steps it drops): nothing reads them before the window's end but the block hashes of the
    blocks its steps fill. A window planned from the steady decodes (``QuietWindow.due``) handles only the rows
    filed under its steps so; the others owe its tokens (engine.core.steady_decodes), logged in ``finish`` for the
    steps it kept."""

    __slots__ = ("engine", "window", "starts", "ends", "next_event_s", "_running", "_starting", "_slow", "_lasts",
                 "_events", "_next", "_used_changes", "_num_waiting", "_waited_s", "_waited", "_rows", "_token_id")

    def __init__(self, engine, token_id: int, window: QuietWindow, starts: array, ends: array) -> None:
        block_manager = engine.scheduler.block_manager
        self.engine = engine
        self.window = window
        self.starts = starts
        self.ends = ends
        self._token_id = token_id
        # The batch of the window's first step; the rows the window handles (a window planned from the steady
        # decodes handles only those filed under its steps: the others owe its tokens, given them in finish).
        self._running = list(engine.scheduler.running)
        self._rows = running = self._running if window.due is None else window.due
        steps = window.num_steps
        block_size = block_manager.block_size
        caching = block_manager.enable_prefix_caching
        # Block events in step order, as the step loop meets them: in a step, first each running sequence's
        # new block (a token crosses a boundary) or registration (a block fills) in running order, when the
        # step is scheduled, then the finishes in running order, when it is postprocessed.
        events = []
        # The computed tokens at the window's start of each sequence with an event in it (None for the others), and
        # their indices: only those are set step by step (advance) and at the end (finish). Every other one is set to
        # its count after the window here, in this pass (nothing reads it before the window's end; a cut or a stop
        # takes the dropped steps back): finish no longer passes over the whole batch, which near capacity (~145
        # sequences, a few steps a window) was most of its time.
        self._starting = starting = [None] * len(running)
        self._slow = slow = []
        lefts = window.lefts
        self._lasts = lasts = [steps] * len(running)  # the steps each sequence takes part in
        # Every token of the window first: a block registered mid-window is hashed from the tokens it holds.
        tokens = array("i", [token_id]) * steps  # extends a simulated array('i') prompt by a copy (a list too)
        first_end_s = ends[0]
        # One pass over the batch, the block manager's two step counts inlined: in a large batch's short windows
        # (~145 sequences, ~7 steps) the calls and a second pass for the tokens were most of this constructor.
        # Most of such a batch computes all the window's tokens strictly inside the block it is in (with 256-token
        # blocks and windows of a few steps, nearly all of it): from an offset 0 < o < block_size - steps in it, a
        # sequence holds that block already (its tokens at offsets 0 .. o - 1 are computed), opens none
        # (decode_steps_to_new_block >= block_size - o > steps) and fills none (decode_steps_to_full_block >=
        # block_size - 1 - o >= steps) unless full blocks wait to be registered (checked). It takes only its tokens,
        # without the arithmetic below that finds no event (-15 to -25 % of this constructor's time).
        inside_below = block_size - steps
        for index, seq in enumerate(running):
            computed = seq.num_computed_tokens
            left = lefts[index]
            if (left > steps and 0 < computed % block_size < inside_below
                    and (not caching or (computed + 1) // block_size <= seq.num_registered_blocks)):
                seq.num_computed_tokens = computed + steps
                seq.token_ids.extend(tokens)
                seq.token_times_s.extend(ends)  # (an array('d') of an array('d'): a copy of the buffer)
                if seq.first_token_s is None:
                    seq.first_token_s = first_end_s
                continue
            starting[index] = computed
            slow.append(index)
            last = lasts[index] = left if left < steps else steps
            # (Most windows are shorter than a block: the ranges below are mostly empty, and checked first; loops, not
            # a generator each, which cost more than the one event they mostly hold.)
            first_block = len(seq.block_table) * block_size - computed  # decode_steps_to_new_block, unclamped
            if first_block < last:
                for k in range(max(first_block, 0), last, block_size):
                    events.append((k, 0, index))
            if caching:
                # Full blocks not yet offered to the cache are registered by the first step (k = 0); after
                # that, one block fills every block_size steps.
                registered = seq.num_registered_blocks
                if (computed + 1) // block_size > registered:
                    events.append((0, 0, index))
                    registered = (computed + 1) // block_size
                first_fill = (registered + 1) * block_size - 1 - computed  # decode_steps_to_full_block
                if first_fill < last:
                    for k in range(first_fill, last, block_size):
                        events.append((k, 0, index))
            if left <= steps:
                events.append((left - 1, 1, index))
            if last == steps:
                seq.token_ids.extend(tokens)
                seq.token_times_s.extend(ends)
            else:
                seq.token_ids.extend(tokens[:last])
                seq.token_times_s.extend(ends[:last])
            if seq.first_token_s is None:  # its first step computed the prompt's last token alone
                seq.first_token_s = first_end_s
        events.sort()
        self._events = events
        self._next = 0  # the first event not yet applied
        if events:  # (_event_s(0), inlined: a call a window)
            k, phase, _ = events[0]
            self.next_event_s = ends[k] if phase else starts[k]
        else:
            self.next_event_s = math.inf
        # Blocks in use after each step, constant between events (a step's row counts its events): (first step,
        # count) pairs, one for each stretch of steps of one count, as the step log keeps them. Written out step by
        # step, a small array made and copied for each event was some 3 % of simulate()'s instructions (Azure trace).
        self._used_changes = [(0, block_manager.num_used_blocks)]
        # The requests waiting at the window's start, and (waited) when the queue grew since and to how many.
        self._num_waiting = len(engine.scheduler.waiting)
        self._waited_s: list[float] = []
        self._waited: list[int] = []

    def waited(self, t_s: float) -> None:
        """A request joined the waiting queue at ``t_s`` (it arrived: a step ending at ``t_s`` or later counts it in
        its row, as the step loop's postprocess, after the arrival, does)."""
        self._waited_s.append(t_s)
        self._waited.append(len(self.engine.scheduler.waiting))

    def _event_s(self, position: int) -> float:
        """When event ``position`` happens: a block event when its step is scheduled, a finish when it ends."""
        if position >= len(self._events):
            return math.inf
        k, phase, _ = self._events[position]
        return self.ends[k] if phase else self.starts[k]

    def advance(self, t_s: float) -> list[Sequence]:
        """Apply the events that happen before ``t_s``; returns the sequences that finished (released, and out of
        the scheduler's running list)."""
        if not self.next_event_s < t_s:
            return []
        engine = self.engine
        scheduler = engine.scheduler
        block_manager = scheduler.block_manager
        events, running, starting, ends = self._events, self._rows, self._starting, self.ends
        used_changes = self._used_changes
        last_used = used_changes[-1][1]  # (the count the last stretch holds, kept as it changes)
        finished: list[Sequence] = []
        position = self._next
        num_events = len(events)
        everything = t_s == math.inf
        while position < num_events:
            k, phase, seq_index = events[position]
            if not everything and not (ends[k] if phase else self.starts[k]) < t_s:
                break
            position += 1
            seq = running[seq_index]
            if phase:
                seq.num_computed_tokens = starting[seq_index] + k + 1
                scheduler.finish_at_length(seq, ends[k])
                finished.append(seq)
            else:
                seq.num_computed_tokens = starting[seq_index] + k
                if not block_manager.append_slots(seq, 1):
                    raise RuntimeError("a quiet window ran out of blocks it had counted as free")
            used = block_manager.num_used_blocks
            if used != last_used:  # (events come in step order: a step's last one says its count)
                if used_changes[-1][0] == k:
                    used_changes[-1] = (k, used)
                else:
                    used_changes.append((k, used))
                last_used = used
        self._next = position
        if position < num_events:  # (_event_s(position), inlined: a call a window)
            k, phase, _ = events[position]
            self.next_event_s = ends[k] if phase else self.starts[k]
        else:
            self.next_event_s = math.inf
        if finished:
            scheduler.drop_finished(finished)  # (all of them: every other running sequence is still running)
            engine.runner.release(finished)
        return finished

    def cut(self, t_s: float) -> bool:
        """End the window after the step in progress at ``t_s`` (after ``advance(t_s)``); False if that is its
        last step already."""
        steps = bisect_left(self.ends, t_s) + 1  # steps 0 .. k, where ends[k - 1] < t_s <= ends[k]
        if steps >= self.window.num_steps:
            return False
        self._keep(steps)  # none of the dropped steps' events is applied: they start after t_s
        return True

    def stop(self, t_s: float) -> list[Sequence]:
        """The window as the step loop leaves it where the simulation stops at ``t_s`` (a watch stopped it): its steps
        that ended by ``t_s`` applied and written to the step log, the step in progress then scheduled (its
        blocks taken) but not postprocessed (no token, no row), none after it. Returns the sequences that finished
        since the last ``advance``. Applied whole instead, the window gave the run's in-flight requests tokens from
        after the stop, and finished some of them after it; planned up to its end and never finished, its steps
        were missing from the step log, the stop's finishes with them."""
        # Steps that end at t_s itself are complete, and the one that starts then is scheduled: the step loop stops
        # only once every event already due at t_s has run (simpy queues the watch's stop behind them). Keeping
        # only the steps that ended strictly before t_s, a stop at the very end of a step gave the fast-forwarded
        # run one token and one step row fewer than the step loop.
        finished = self.advance(math.nextafter(t_s, math.inf))
        steps = bisect_right(self.ends, t_s)  # ends[steps - 1] <= t_s < ends[steps]
        if steps < self.window.num_steps:
            self._keep(steps)
        return finished + self.finish()

    def _keep(self, steps: int) -> None:
        """Make the window its first ``steps`` steps: the later ones' tokens taken back, and those of their events
        not applied dropped (the step in progress at a stop has taken its blocks: kept taken, as the step loop has)."""
        window = self.window
        del self._events[max(self._next, bisect_left(self._events, (steps,))):]
        lefts = window.lefts
        lasts, starting = self._lasts, self._starting
        for index, seq in enumerate(self._rows):
            last = lasts[index]
            kept = lefts[index] if lefts[index] < steps else steps
            if kept < last:
                del seq.token_ids[kept - last:]
                del seq.token_times_s[kept - last:]
                lasts[index] = kept
                if starting[index] is None:  # (set to its count after the whole window up front)
                    seq.num_computed_tokens -= last - kept
                if not seq.token_times_s:  # its first token was to come in the window (kept = 0: at a stop only)
                    seq.first_token_s = None
        window.end_s = self.ends[steps - 1] if steps else self.starts[0]  # (none: where its first step began)
        self.starts, self.ends = self.starts[:steps], self.ends[:steps]
        window.num_steps = steps
        window.stopped_by_horizon = True
        window.bounds = _cut_segments(window.bounds, window.batches, steps)
        self.next_event_s = self._event_s(self._next)

    def finish(self) -> list[Sequence]:
        """Apply the rest of the window and write its step-log rows; returns the sequences that finished in it
        since the last ``advance``, in the order the step loop finishes them."""
        finished = self.advance(math.inf)
        window = self.window
        steps = window.num_steps
        # The window's last step ran every sequence that takes part in it: the next step continues that batch or not.
        running, lasts = self._rows, self._lasts
        starting = self._starting
        for index in self._slow:
            running[index].num_computed_tokens = starting[index] + lasts[index]
        bounds, lefts, starts, ends = window.bounds, window.lefts, self.starts, self.ends
        # Those that take part in its last step: all but the ones that finished before it (lasts[i] = min(left, steps))
        last_batch = self._running
        if window.due is None:
            if min(lefts) < steps:
                last_batch = []
                for seq, left in zip(running, lefts):  # (a loop: a comprehension is a function call of its own)
                    if left >= steps:
                        last_batch.append(seq)
        else:
            # The rows it did not handle owe its tokens (before the handled ones are filed afresh: owing from after).
            self.engine.scheduler.steady_decodes.owe_window(self._token_id, ends, running)
            if lefts and min(lefts) < steps:
                # Taken out one by one (found by bisection: the batch is in running order): a few rows of ~150 finish
                # early, and a pass over the batch for them was ~3 % of simulate()'s bytecodes near capacity.
                last_batch = last_batch[:]
                for seq, left in zip(running, lefts):
                    if left < steps:
                        del last_batch[index_in_running(last_batch, seq)]
        self.engine.scheduler.ran_decode_batch(last_batch, steps)
        step_log = self.engine.step_log
        # Whether the runner launches a step that repeats its batch ahead of it: where no request can be admitted next
        # (ScheduledBatch.next_admits_none, as the simulator's runner reads it): every step of a window nobody waits
        # through; one that requests wait through only at max_num_seqs (its batch, one segment, may also be held by
        # the token budget alone, where a launch waits for the scheduler).
        scheduler = self.engine.scheduler
        ran_ahead = int(getattr(self.engine.runner, "runs_decode_ahead", False) and (
            not window.admits_none or len(self._running) >= scheduler.config.max_num_seqs))
        # The requests waiting after each step are constant between the steps that first count an arrival: a
        # segment is written as runs of rows between those (mostly one run). Every window of a replica whose windows
        # take the step a request arrives in has one arrival in its last step; finding the runs row by row made
        # simulate() on the Azure trace 11 % more instructions.
        changes = self._waiting_changes(steps)
        # The count of the stretch that holds run_first, and the next stretch's first step and count (the window's
        # step count where none: no run reaches it). Kept in locals as the stretches are passed, not indexed afresh
        # for each run (~40 bytecodes a run, a run or two a window on the Azure trace).
        num_waiting = changes[0][1]
        at = 1
        next_change, next_count = changes[1] if len(changes) > 1 else (steps, 0)
        # The blocks in use, given with the window's first run for all of its runs (the step log's stretches run on
        # over the runs after it); those of steps a cut or a stop dropped left out.
        used_changes = self._used_changes
        if used_changes[-1][0] >= steps:
            used_changes = used_changes[:bisect_left(used_changes, (steps,))]
        for j, (bs, contexts, longest) in enumerate(window.batches):
            first, end = bounds[j], bounds[j + 1]
            num_finishing = lefts.count(end)  # in the segment's last step
            # Runs of rows of one waiting count but maybe the last (the first step whose count differs ends one).
            run_first = first
            while run_first < end:
                while next_change <= run_first:  # (the stretches' first steps ascend)
                    num_waiting = next_count
                    at += 1
                    next_change, next_count = changes[at] if at < len(changes) else (steps, 0)
                if next_change < end:  # the run ends with the first row that counts the next stretch's requests
                    run_end, waiting_last = next_change + 1, next_count
                else:
                    run_end, waiting_last = end, num_waiting
                k = run_first - first
                step_log.extend_quiet(bs, contexts + bs * k, longest + k, None if run_first else used_changes,
                                      starts[run_first], ends[run_first:run_end],
                                      num_finishing if run_end == end else 0, waiting_last,
                                      1 if k else 0 if j else window.continues_first, ran_ahead, num_waiting)
                run_first = run_end
        return finished

    def _waiting_changes(self, steps: int) -> list[tuple[int, int]]:
        """The requests waiting after each of the window's ``steps`` steps, as the step loop counts them, as (first
        step, count) pairs, one for each stretch of steps of one count (the first from step 0): those waiting at its
        start and those that joined by the step's end (an arrival at a step's very end comes before its
        postprocess). Nobody leaves the queue in a window (none is admitted)."""
        changes = [(0, self._num_waiting)]
        if not self._waited_s:
            return changes
        # The first step that counts each arrival: the first whose end is not before it (ends ascend). Mostly one
        # arrival, in the last step: a bisection each, cheaper than numpy's calls for so few.
        ends = self.ends
        for t_s, count in zip(self._waited_s, self._waited):
            first = bisect_left(ends, t_s, 0, steps)
            if first >= steps:  # joined after the window's last step ended: no row of it counts the request
                break
            if first == changes[-1][0]:  # the later of two arrivals counted from the same step
                changes[-1] = (first, count)
            else:
                changes.append((first, count))
            if len(changes) > 1 and changes[-1][1] == changes[-2][1]:  # (a rejected arrival left the count)
                changes.pop()
        return changes
