"""Decides what each engine step computes (torch-free; the simulator runs this very code).

Two policies, chosen by ``EngineConfig.policy``:

- ``mixed`` (default), continuous batching as in vLLM v1: every step first advances the running
  sequences (a decode token each, or the next chunk of a prompt), then fills the rest of the token
  budget with waiting prompts, splitting long prompts into chunks. Under KV pressure the newest
  running sequence is preempted (its blocks freed; it is recomputed later), and no new request is
  admitted in a step that preempted.
- ``nano``, as in nano-vLLM: a step is all-prefill when the oldest waiting prompt fits (whole, no
  chunking), otherwise all-decode.

``schedule()`` returns a ``ScheduledBatch``; the runner computes it; ``postprocess()`` appends the
sampled tokens, applies the stop rules and frees finished sequences. Per-step work grows with the
number of running sequences only, never with the waiting or finished ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.core.block_manager import BlockManager
from engine.core.config import EngineConfig
from engine.core.sampling_params import may_stop
from engine.core.sequence import FINISHED, REJECTED, RUNNING, WAITING, FinishReason, Sequence, index_in_running
from engine.core.steady_decodes import SteadyDecodes

# The large-batch path (Scheduler._advance_steady) pays a fixed cost per step and saves a per-row one: below this
# many running sequences the per-row loop is as cheap. At most this many rows a step take the per-row path
# beside it (each is looked up in the running list); more, and the step is all per-row.
_MIN_STEADY_ROWS = 32
# The same for the simulator (lazy tokens: a quiet window over an all-steady batch is planned from the steady decodes'
# calendar), chosen by simulate() instructions (benchmarks/sim_instructions.py), from at least 1 / 2 / 4 / 8 / 16 / 32
# rows: the Azure 2023 conversation trace's first 5,000 requests 3.477 / 3.309 / 3.056 / 2.924 / 2.922 / 2.921e9; the
# 64-replica fleet (--sessions, batches of 1-3) 3.939e9 from 1, 3.414e9 from 16, 3.416e9 from 32;
# traces/sharegpt.parquet at 40 req/s (~145 rows, under 32 only as it fills and drains) 1.487e9 from 8 or 16, 1.493e9
# from 32. Small batches do not pay: their windows are long (~110 steps on the Azure trace, against 256-token blocks),
# so half (Azure) to nearly all (the fleet) of a window's rows have an event in it and are read all the same, and
# filing, settling and logging them, window after window and step after step, costs more than the pass over a few
# rows it saves. Batches of 16-31 rows near capacity run windows of a few steps, in which most rows just owe.
_MIN_LAZY_STEADY_ROWS = 16
_MAX_SPECIAL_ROWS = 16
# drop_finished removes up to this many finished sequences from the running list one by one, more by a pass.
_MAX_REMOVALS = 16
_INT32 = 1 << 31  # a lazily owed token is logged in an array('i'), as the simulator's prompts are held


@dataclass(slots=True)
class ScheduledBatch:
    """One step's work. ``num_new_tokens[i]`` tokens of ``seqs[i]`` are computed, starting at that
    sequence's ``num_computed_tokens``; a sequence samples a token when that reaches its end.

    A row computing a single token counts as a decode: that is how the runner executes it (decode
    kernels, CUDA graphs) and what it costs, whether it is a decode or a prompt's last token computed
    alone (a chunk remainder, or a prefix-cache hit covering all but one token)."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_prefill_seqs: int = 0
    num_prefill_tokens: int = 0
    prefill_context_tokens: int = 0  # tokens already in cache before the prefill chunks
    num_decode_seqs: int = 0
    decode_context_tokens: int = 0  # KV tokens the decode sequences attend to (their new token included)
    max_decode_context_tokens: int = 0  # the longest of those: split-KV decode time follows it when one is long
    prefill_attention_pairs: int = 0  # (query, key) pairs of the prefill chunks: sum of q * (context + (q + 1) / 2)
    # 1: a decode-only step whose sequences are exactly the previous step's, which was decode-only too (each one
    # token on): a runner can plan it while the previous step runs (the GPU runner's NextDecode does, and the
    # cost model prices the others higher). Set by Scheduler.schedule.
    continues_batch: int = 0
    # True when the next step can admit no request unless one of this step's sequences finishes: none waits, or the
    # running batch is at max_num_seqs. Then a decode-only step in which none finishes is followed by the same batch,
    # each row one token on (bar a preemption): a runner may launch that step before this one is postprocessed (the
    # GPU runner's run-ahead). Set by Scheduler.schedule.
    next_admits_none: bool = False
    # Set by the scheduler's large-batch path (postprocess reads them; a runner may ignore them): rows
    # [0, steady_rows) are the running list, each a plain decode but the rows listed in special_rows (ascending).
    special_rows: list[int] | None = None
    steady_rows: int = 0
    # The step's number in its engine's step log, from 0 (set by LLMEngine.begin_step and the quiet-window
    # planner): a cost model that draws per-step noise keys it on this, so a step's price does not depend on the
    # order in which steps are priced (fast-forward prices a window's steps ahead, some of them more than once).
    step_index: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_batched_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_seqs

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    def count_decode_rows(self, num: int, context_tokens: int, longest: int) -> None:
        """Count ``num`` decode rows already appended to ``seqs`` (and ``num_new_tokens``, 1 each): their summed
        contexts, the new token included, and the longest context in the batch now; as ``add`` counts one."""
        self.num_decode_seqs += num
        self.decode_context_tokens += context_tokens
        self.max_decode_context_tokens = longest

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.count_row(seq.num_computed_tokens, num_new_tokens)

    def count_row(self, context: int, num_new_tokens: int) -> None:
        """Count a row already in ``seqs``: ``num_new_tokens`` computed after ``context`` cached ones."""
        if num_new_tokens == 1:
            self.num_decode_seqs += 1
            self.decode_context_tokens += context + 1
            if context + 1 > self.max_decode_context_tokens:
                self.max_decode_context_tokens = context + 1
        else:
            self.num_prefill_seqs += 1
            self.num_prefill_tokens += num_new_tokens
            self.prefill_context_tokens += context
            self.prefill_attention_pairs += num_new_tokens * context + num_new_tokens * (num_new_tokens + 1) // 2


class Scheduler:
    # Plain decode tokens skip append_slots when it would do nothing (see _advance_running); False sends every
    # sequence through it, the general path the inlined case must match (tests compare the two).
    inline_plain_decodes = True
    # A large batch's plain decode rows are not checked one by one at all while engine.core.steady_decodes knows them
    # to be plain (see _advance_steady); False checks every row every step (tests compare the two).
    steady_plain_decodes = True

    def __init__(self, config: EngineConfig, eos_token_ids: Iterable[int] = (), lazy_tokens: bool = False) -> None:
        """``lazy_tokens``: a large batch's plain decode rows owe their tokens rather than get them appended each
        step (engine.core.steady_decodes), for a runner that reads no sequence's tokens (the simulator's); whoever
        else reads a running sequence's tokens or counts calls ``settle_tokens`` first."""
        if not config.is_resolved:
            raise ValueError("the scheduler needs num_gpu_blocks and max_model_len resolved (EngineConfig.resolved)")
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(config.num_gpu_blocks, config.block_size, config.enable_prefix_caching)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._num_appended = 0  # sequences appended to running so far (each one's running_order)
        self._schedule = self._schedule_mixed if config.policy == "mixed" else self._schedule_nano
        max_seq_len, cut_by = config.max_seq_len_limit
        self._max_seq_len = max_seq_len
        self._cut_reason = FinishReason(cut_by)  # what a sequence asking for more than max_seq_len is cut by
        # The longest prompt rejection_reason_for lets through (the config is frozen): each of its limits at once.
        self._max_servable_prompt = min(config.max_model_len, config.num_gpu_blocks * config.block_size)
        if config.policy == "nano":  # which does not chunk a prompt
            self._max_servable_prompt = min(self._max_servable_prompt, config.max_num_batched_tokens)
        self._now_s = 0.0
        self._last_decode_seqs: list[Sequence] | None = None  # the last step's sequences, if it was decode-only
        # Which running rows are plain decodes (public: a quiet window's planner reads its calendar and totals).
        self.steady_decodes = SteadyDecodes(config.block_size, config.enable_prefix_caching, lazy=lazy_tokens)
        self._filing = False  # whether postprocess files its rows in _steady (large batches only)
        # The fewest running sequences that take the large-batch path (tests lower it to reach it with small batches).
        self.min_steady_rows = _MIN_LAZY_STEADY_ROWS if lazy_tokens else _MIN_STEADY_ROWS

    # ---- requests -------------------------------------------------------------------------------
    def rejection_reason_for(self, n: int) -> str | None:
        """Why a prompt of ``n`` tokens can never be served by this configuration, or None."""
        if 0 < n <= self._max_servable_prompt:  # (asked twice of every simulated request: at arrival and add)
            return None
        cfg = self.config
        if n == 0:
            return "empty prompt"
        if n > cfg.max_model_len:
            return f"prompt has {n} tokens, more than max_model_len={cfg.max_model_len}"
        num_blocks = self.block_manager.num_blocks_for(n)
        if num_blocks > cfg.num_gpu_blocks:
            return (
                f"prompt needs {num_blocks} KV blocks of {cfg.block_size} tokens, "
                f"the cache has {cfg.num_gpu_blocks}"
            )
        if cfg.policy == "nano" and n > cfg.max_num_batched_tokens:
            return (
                f"prompt has {n} tokens, more than max_num_batched_tokens={cfg.max_num_batched_tokens}, "
                "and the nano policy does not chunk prefills"
            )
        return None

    def add(self, seq: Sequence) -> bool:
        """Queue ``seq``; a request that can never fit is finished as rejected at once (returns False)."""
        if not 0 < seq.num_prompt_tokens <= self._max_servable_prompt:  # (rejection_reason_for's own first test)
            self.reject(seq, self.rejection_reason_for(seq.num_prompt_tokens))
            return False
        # A prefill always samples one token, so a prompt as long as the limit still gets that one: asking for just
        # it is no cut (it was labelled one, counted in num_cut, though every token asked for came).
        limit = max(self._max_seq_len, seq.num_prompt_tokens + 1)
        if seq.max_num_tokens > limit:
            seq.max_num_tokens = limit
            seq.length_reason = self._cut_reason
        seq.status = WAITING
        self.waiting.append(seq)
        return True

    def add_running(self, seq: Sequence) -> None:
        """Put ``seq``, whose blocks the caller allocated, straight into the running batch (sim.profile builds its
        grid's batches so); the running list is otherwise the scheduler's own."""
        seq.status = RUNNING
        self._append_running(seq)

    def _append_running(self, seq: Sequence) -> None:
        """Append ``seq`` to the running list, numbered after every sequence appended before it (the running list
        stays sorted by ``running_order``: index_in_running's bisection)."""
        seq.running_order = self._num_appended
        self._num_appended += 1
        self.running.append(seq)
        self.steady_decodes.admitted(seq)

    def reject(self, seq: Sequence, reason: str) -> None:
        seq.status = FINISHED
        seq.finish_reason = REJECTED
        seq.reject_reason = reason

    def _withdraw(self, seq: Sequence, reason: FinishReason) -> None:
        """Take an unfinished ``seq`` out of its queue and finish it (its blocks freed)."""
        (self.running if seq.status is RUNNING else self.waiting).remove(seq)
        self._finish(seq, reason)

    def abort(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self._withdraw(seq, FinishReason.ABORTED)

    def fail(self, seqs: list[Sequence], message: str, now_s: float) -> list[Sequence]:
        """Finish ``seqs`` with ERROR (their blocks freed); returns those that were still unfinished."""
        failed = [seq for seq in seqs if not seq.is_finished]
        for seq in failed:
            seq.error = message
            seq.finish_s = now_s
            self._withdraw(seq, FinishReason.ERROR)
        self.forget_plain_decodes()  # the others did not get this step's tokens
        return failed

    def recompute_holders(self, blocks: set[int]) -> list[Sequence]:
        """Running sequences that count one of ``blocks`` (withdrawn from the prefix cache: their KV was never written)
        among their computed tokens start over, as after a preemption (their blocks freed, back at the head of the
        queue in their order); returns them."""
        if not blocks:
            return []
        block_size = self.block_manager.block_size
        holders = [seq for seq in self.running
                   if not blocks.isdisjoint(seq.block_table[:seq.num_computed_tokens // block_size])]
        if holders:
            restarted = set(map(id, holders))  # (by identity: Sequence defines no equality)
            self.running = [seq for seq in self.running if id(seq) not in restarted]
            for seq in reversed(holders):
                self._preempt(seq)
            self._last_decode_seqs = None
            self.forget_plain_decodes()
        return holders

    def forget_plain_decodes(self) -> None:
        """Sequences moved other than one token per step (a step that was not applied, or many applied at once):
        the next step checks every row (engine.core.steady_decodes)."""
        self.steady_decodes.forget(self.running)

    def settle_tokens(self) -> None:
        """Bring every running sequence's tokens, token times and computed count up to date (with ``lazy_tokens``
        they may owe some: engine.core.steady_decodes); a no-op otherwise."""
        self.steady_decodes.settle_all()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling -----------------------------------------------------------------------------
    def schedule(self, now_s: float = 0.0) -> ScheduledBatch:
        """Pick this step's work; ``now_s`` stamps the first scheduling of newly admitted requests."""
        self._now_s = now_s
        batch = self._schedule()
        batch.next_admits_none = not self.waiting or len(self.running) >= self.config.max_num_seqs
        if batch.num_prefill_seqs or not batch.seqs:
            self._last_decode_seqs = None
        else:
            batch.continues_batch = self.continues_last_batch(batch.seqs)
            self._last_decode_seqs = batch.seqs
        return batch

    def continues_last_batch(self, seqs: list[Sequence]) -> int:
        """1 if a decode-only step of ``seqs`` repeats the last step's batch (see ScheduledBatch.continues_batch).
        Sequences compare by identity, element by element."""
        return int(seqs == self._last_decode_seqs)

    def ran_decode_batch(self, seqs: list[Sequence], num_steps: int) -> None:
        """The last ``num_steps`` steps were decode-only, the last of them over ``seqs`` (a run of steps applied at
        once, engine.core.quiet_window)."""
        self._last_decode_seqs = seqs
        self.steady_decodes.skipped(num_steps)

    def _preempt(self, seq: Sequence) -> None:
        self.steady_decodes.left(seq)
        self.block_manager.free(seq)
        seq.status = WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, seq: Sequence, budget: int, chunked: bool) -> int:
        """Try to start the waiting head ``seq``; returns the tokens it computes this step (0: not admitted)."""
        bm = self.block_manager
        cached_blocks = bm.find_cached_prefix(seq)
        num_cached = len(cached_blocks) * bm.block_size
        num_new = len(seq.token_ids) - num_cached
        if num_new > budget:
            if not chunked:
                return 0
            num_new = budget
        if not bm.allocate(seq, cached_blocks, num_new):
            return 0
        self.waiting.popleft()
        seq.status = RUNNING
        if seq.first_scheduled_s is None:
            seq.first_scheduled_s = self._now_s
            seq.num_cached_tokens = num_cached
        self._append_running(seq)
        return num_new

    def _reserve_or_preempt(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Find room for ``seq``'s next tokens, preempting the newest running sequences as needed.
        Returns False if ``seq`` itself had to be preempted."""
        while not self.block_manager.append_slots(seq, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _advance_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Give running sequences their next tokens (a decode token, or the next prompt chunk), oldest
        first, preempting the newest under KV pressure; returns the budget left."""
        if self.steady_plain_decodes and len(self.running) >= self.min_steady_rows:
            if self._filing:  # (else no row is filed yet: every one is special, and postprocess would file none)
                left = self._advance_steady(batch, budget)
                if left is not None:
                    return left
            # Row by row, this step may stop short of some sequences or preempt others: whatever was known of which
            # rows are plain is re-learnt from the rows as postprocess sees them.
            self.steady_decodes.forget(self.running)
            self._filing = True
        elif self._filing:  # a small batch: not worth knowing, and what was known goes stale
            self.steady_decodes.forget(self.running)
            self._filing = False
        running = self.running
        block_manager = self.block_manager
        block_size = block_manager.block_size
        caching = block_manager.enable_prefix_caching
        inline = self.inline_plain_decodes
        # The plain decode rows are added to the batch here rather than through batch.add (one call per row of
        # every step was a fifth of a large batch's scheduling): the same lists appended in the same order, their
        # counts summed locally and added to the batch before any other row is (and at the end).
        seqs_append, new_tokens_append = batch.seqs.append, batch.num_new_tokens.append
        num_plain = plain_context = 0
        longest = batch.max_decode_context_tokens
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            computed = seq.num_computed_tokens
            if (inline and len(seq.token_ids) - computed == 1 and computed < len(seq.block_table) * block_size
                    and not (caching and (computed + 1) // block_size > seq.num_registered_blocks)):
                # The common case of a large batch: a decode token in a block the sequence already holds,
                # filling none, for which append_slots would allocate and register nothing (this mirrors
                # BlockManager.append_slots' two conditions; change both together): skip it.
                seqs_append(seq)
                new_tokens_append(1)
                num_plain += 1
                plain_context += computed + 1
                if computed + 1 > longest:
                    longest = computed + 1
                budget -= 1
                index += 1
                continue
            if num_plain:
                batch.count_decode_rows(num_plain, plain_context, longest)
                num_plain = plain_context = 0
            num_new = min(len(seq.token_ids) - computed, budget)
            if not self._reserve_or_preempt(seq, num_new, batch):
                break
            batch.add(seq, num_new)
            longest = batch.max_decode_context_tokens
            budget -= num_new
            index += 1
        if num_plain:
            batch.count_decode_rows(num_plain, plain_context, longest)
        return budget

    def _advance_steady(self, batch: ScheduledBatch, budget: int) -> int | None:
        """``_advance_running`` for a large batch whose rows are known plain (engine.core.steady_decodes) but for a
        few: the batch is the running list copied, and only those few rows are looked at, in order, as the per-row
        loop would. None (nothing changed) unless every row gets all its tokens and every block it needs is free:
        then the per-row loop would neither stop short nor preempt, and the two give the same batch and blocks."""
        running = self.running
        steady = self.steady_decodes
        if not steady.consistent_with(running):
            return None
        due = steady.due()  # (paid up, lazy tokens: their rows are read below)
        specials = [*due, *steady.unsteady]
        if len(specials) > _MAX_SPECIAL_ROWS:
            return None
        block_manager = self.block_manager
        num_rows = len(running)
        num_tokens = num_rows - len(specials)
        num_blocks = 0
        for seq in specials:
            num_new = len(seq.token_ids) - seq.num_computed_tokens
            if num_new < 1:
                return None
            num_tokens += num_new
            num_blocks += block_manager.num_new_blocks(seq, num_new)
        if num_tokens > budget or num_blocks > block_manager.num_free_blocks:
            return None
        # A due row whose event is a block (opened or filled) needs the block manager now but nothing of postprocess
        # (its token neither its last nor a stop: steady rows have no stop tokens of their own, and an eos row is
        # found by postprocess whatever it is): it stays a plain row, steady, filed afresh once its block is handled
        # below (SteadyDecodes.decoded_in_place), and needs no position (-1). Only the rows sampling their last token
        # leave the steady ones. Each row as (running_order, position, sequence): sorted, in running order.
        leaving = []
        rows = []
        try:
            # By bisection on the order they were appended in (index_in_running), the unsteady rows too (mostly the
            # requests admitted since the last step, the running list's last rows).
            for seq in due:
                if seq.max_num_tokens - seq.num_computed_tokens <= 2:
                    leaving.append(seq)
                    rows.append((seq.running_order, index_in_running(running, seq), seq))
                else:
                    rows.append((seq.running_order, -1, seq))
            for seq in steady.unsteady:
                rows.append((seq.running_order, index_in_running(running, seq), seq))
        except ValueError:  # one is not running: the bookkeeping is off (running edited directly); row by row
            return None
        rows.sort()  # (by running_order alone: no two rows share one)
        steady.take_due(leaving)  # the steady sequences are the plain rows now
        new_tokens = [1] * num_rows
        num_decode = num_rows
        special_context = 0  # the special decode rows' computed tokens, summed, and the largest
        special_longest = -1
        special_rows = []
        for _, position, seq in rows:  # in running order, as the per-row loop allocates
            computed = seq.num_computed_tokens
            num_new = len(seq.token_ids) - computed
            if not block_manager.append_slots(seq, num_new):
                raise RuntimeError("a large-batch step ran out of blocks it had counted as free")
            if position < 0:  # a block event: a plain row (its context in plain_context's sums)
                steady.decoded_in_place(seq)
                continue
            special_rows.append(position)
            new_tokens[position] = num_new
            if num_new != 1:
                batch.count_row(computed, num_new)  # a prompt chunk
                num_decode -= 1
            else:
                special_context += computed
                if computed > special_longest:
                    special_longest = computed
        batch.seqs = running[:]
        batch.num_new_tokens = new_tokens
        if num_decode:
            # The plain rows' sums are kept by engine.core.steady_decodes (what they owe, lazy tokens, counted).
            plain_context, plain_longest = steady.plain_context()
            batch.count_decode_rows(num_decode, plain_context + special_context + num_decode,
                                    max(plain_longest, special_longest) + 1)
        batch.special_rows = special_rows
        batch.steady_rows = num_rows
        return budget - num_tokens

    def _admit_waiting(self, batch: ScheduledBatch, budget: int, chunked: bool) -> None:
        """Start waiting requests in arrival order while they fit (FCFS: the first that does not fit stops it)."""
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            num_new = self._admit(waiting[0], budget, chunked)
            if num_new == 0:
                break
            batch.add(self.running[-1], num_new)
            budget -= num_new

    def _schedule_mixed(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._advance_running(batch, self.config.max_num_batched_tokens)
        if not batch.preempted:  # as vLLM: a step that had to preempt admits nobody
            self._admit_waiting(batch, budget, chunked=True)
        return batch

    def _schedule_nano(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        self._admit_waiting(batch, self.config.max_num_batched_tokens, chunked=False)
        if not batch.seqs:  # all-prefill when anything could be admitted, else all-decode
            self._advance_running(batch, self.config.max_num_batched_tokens)
        return batch

    # ---- after the runner -----------------------------------------------------------------------
    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.status = FINISHED
        seq.finish_reason = reason
        self.steady_decodes.left(seq)
        self.block_manager.free(seq)

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int], now_s: float) -> list[Sequence]:
        """Record the step's results: ``token_ids[i]`` is the token sampled for ``batch.seqs[i]``
        (ignored for prompt chunks that do not reach the end). Returns the sequences that finished."""
        finished: list[Sequence] = []
        if batch.special_rows is None:
            for seq, num_new, token_id in zip(batch.seqs, batch.num_new_tokens, token_ids):
                self._postprocess_row(seq, num_new, token_id, now_s, finished)
        else:
            self._postprocess_steady(batch, token_ids, now_s, finished)
        if finished:
            self.drop_finished(finished)
        for seq in finished:
            seq.finish_s = now_s
        return finished

    def _postprocess_row(self, seq: Sequence, num_new: int, token_id: int, now_s: float,
                         finished: list[Sequence]) -> None:
        """One row's results; a sequence it finishes is appended to ``finished``, one it does not is filed as a
        plain decode or not (engine.core.steady_decodes)."""
        computed = seq.num_computed_tokens = seq.num_computed_tokens + num_new
        tokens = seq.token_ids
        if computed < len(tokens):  # a prompt chunk: nothing sampled yet
            if self._filing:
                self.steady_decodes.file(seq)
            return
        tokens.append(token_id)
        seq.token_times_s.append(now_s)
        if seq.first_token_s is None:
            seq.first_token_s = now_s
        params = seq.sampling_params
        # (min_tokens read only for a stop token. The engine's sampler masks them until then; a runner that does not,
        # the simulator's, still gets no early stop)
        if (((not params.ignore_eos and token_id in self.eos_token_ids) or token_id in params.stop_token_ids)
                and may_stop(len(tokens) - seq.num_prompt_tokens, params.min_tokens)):
            self._finish(seq, FinishReason.STOP)
            finished.append(seq)
        elif len(tokens) >= seq.max_num_tokens:
            self._finish(seq, seq.length_reason)
            finished.append(seq)
        elif self._filing:
            self.steady_decodes.file(seq)

    def _postprocess_steady(self, batch: ScheduledBatch, token_ids: list[int], now_s: float,
                            finished: list[Sequence]) -> None:
        """Postprocess of a batch from ``_advance_steady``: its plain rows (neither due, nor sampling an eos token)
        only get their token, as ``_postprocess_row`` would give it them (no finish, no block, first token long
        since); the special rows, the rows admitted after them and the eos rows go through ``_postprocess_row``."""
        seqs, new_tokens = batch.seqs, batch.num_new_tokens
        num_rows = len(seqs)
        steady = self.steady_decodes
        rows = batch.special_rows
        if batch.steady_rows < num_rows:
            rows = rows + list(range(batch.steady_rows, num_rows))
        if steady.lazy:
            token_id = token_ids[0]
            # Every row sampling the same token (the simulator's runner samples one for all), the eos check is of that
            # token alone, not a pass hashing every row's.
            uniform = token_ids.count(token_id) == num_rows
            eos = self.eos_token_ids.intersection((token_id,) if uniform else token_ids)
            if not eos and -_INT32 <= token_id < _INT32 and uniform:
                # Every plain row (every steady sequence but those due) owes this step's token: logged once. The
                # others are not owing: their rows get it here, and a row filed afresh owes from the next step on.
                # Whether requests wait or not: the debts are paid when something reads every row (a quiet window's
                # planner where some row is not steady: a window of steady rows leaves them owing), each row's in two
                # extends whatever it owes, about one step's two appends, so owing for two steps already saves.
                # (Owing only while requests waited two steps in a row, as before: sharegpt at 40 req/s 1.8 % more
                # instructions, at 60 1.5 %.)
                steady.advance += 1  # every steady sequence gets its token now: owed
                steady.log_step(token_id, now_s)
                for row in rows:
                    self._postprocess_row(seqs[row], new_tokens[row], token_ids[row], now_s, finished)
                return
            # Not a lazy step (an eos, or rows sampled different tokens): as without. (Paid before the advance: a
            # debt is counted from it.)
            steady.settle_all()
        else:
            eos = self.eos_token_ids.intersection(token_ids)
        steady.advance += 1  # every steady sequence gets its token now
        if eos:  # which rows stop is _postprocess_row's to say (ignore_eos)
            rows = sorted({*rows, *(i for i, token_id in enumerate(token_ids) if token_id in eos)})
        start = 0
        for row in (*rows, num_rows):
            for seq, token_id in zip(seqs[start:row], token_ids[start:row]):
                seq.num_computed_tokens += 1
                seq.token_ids.append(token_id)
                seq.token_times_s.append(now_s)
            if row < num_rows:
                self._postprocess_row(seqs[row], new_tokens[row], token_ids[row], now_s, finished)
            start = row + 1

    def finish_at_length(self, seq: Sequence, now_s: float) -> None:
        """``seq`` sampled its last allowed token in the step that ended at ``now_s``: finished as postprocess
        finishes it (its blocks freed), for a run of steps applied at once (engine.core.quiet_window), which
        then calls ``drop_finished``."""
        self._finish(seq, seq.length_reason)
        seq.finish_s = now_s

    def drop_finished(self, finished: list[Sequence] | None = None) -> None:
        """Take the finished sequences out of ``running`` (order kept); ``finished``, when given, are all of them."""
        # A large batch loses one or two a step, a quiet window a few: each found by bisection (index_in_running)
        # and deleted, where a pass over the batch costs as much as some 16 such.
        if finished is not None and len(finished) <= _MAX_REMOVALS:
            running = self.running
            try:
                for seq in finished:
                    del running[index_in_running(running, seq)]
                return
            except ValueError:  # one was not running any more (withdrawn while its step ran): filter them all
                pass
        self.running = [s for s in self.running if s.status is RUNNING]
