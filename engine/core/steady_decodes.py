"""Which running sequences are plain decodes, and until when (torch-free; the scheduler's large-batch path).

In a large batch most rows are *plain* decodes: one token each, in a block the sequence already holds, filling
none, sampling a token that neither stops it nor reaches its length. Such a row needs nothing of the scheduler
but to be in the batch, and nothing of postprocess but its token appended. Whether a row is plain changes only
at known steps: a sequence decoding from ``c`` computed tokens next needs the block manager when its token
opens a block (``len(block_table) * block_size - c`` steps on) or fills one that is offered to the prefix cache
(``(num_registered_blocks + 1) * block_size - 1 - c``), and finishes by length ``max_num_tokens - c - 2`` steps
on. So each such sequence is filed under the *advance* (a count of the steps that gave every steady sequence
one token) at which it next needs its own row handled; in between, the scheduler copies the running list as
the batch and postprocess appends tokens without checking each row (engine.core.scheduler).

A sequence is *steady* while it is filed; the others (just admitted, mid-prompt, with stop tokens of its own,
or not yet seen since the bookkeeping was last forgotten) are *unsteady* and take the general per-row path
every step. A run of quiet steps applied at once (engine.core.quiet_window) counts as that many advances, and
the sequences filed under one of them are filed afresh. Where every running sequence is steady and owes its tokens
(``covers``), such a window is planned from the calendar (``filed_within``: only the rows with an event in it are
read) and its steps are logged once for the others (``owe_window``), which keep owing through it. Anything else
that moves sequences other than one token per advance (a preemption, a step cut short by the token budget, a failed
step) forgets it all: the next step takes the general path for every row and files them again.

*Lazy tokens* (the simulator's choice, ``lazy=True``): a steady sequence need not even get its token appended
each step. Where every plain row of a step samples the same token (the simulator's runner samples one token id
for all), the step is written once to a log (its token and its time), one entry an advance, and each steady
sequence *owes* the log's entries since it was filed or last paid: its ``token_ids``, ``token_times_s`` and
``num_computed_tokens`` lag by that many, which its key below tells (the log's last ``key + advance -
num_computed_tokens``). ``settle`` pays one sequence's debt (two extends and an addition), and
whatever reads a running sequence's tokens or counts must settle it first: the scheduler does for every row it
handles itself (due, leaving, forgotten), and a reader of the whole batch (a quiet window's planner, the
simulator's stop) calls ``settle_all``. The scheduler owes in every step it can (Scheduler._postprocess_steady
says why); a step whose rows sample different tokens, or an eos, settles everything and appends row by row, as
without. The GPU engine never asks for it (its runner reads every row's last token).

The sums of the batch's contexts the scheduler needs each step (the plain rows' computed tokens, summed, and the
longest) come from running totals kept as sequences are filed and leave, not from the rows (``plain_context``): a
steady sequence's count less the advance is the same at every advance until its row is handled again.
"""

from __future__ import annotations

from array import array

from engine.core.sequence import RUNNING, Sequence


class SteadyDecodes:
    __slots__ = ("advance", "steady", "unsteady", "_calendar", "_block_size", "_caching", "lazy", "_log_tokens",
                 "_log_times", "_keys", "_key_sum", "_key_max")

    def __init__(self, block_size: int, caching: bool, lazy: bool = False) -> None:
        self.lazy = lazy
        # Lazy tokens: the steps logged since the debts were last all paid (none: nobody owes), one entry an advance.
        # What a steady sequence owes is the log's last ``key + advance - num_computed_tokens`` entries (its key, below:
        # its settled count less the advance), so no position is kept for it: a debt is begun, paid and dropped with
        # the key's own bookkeeping (a dict of positions and one of debtors by position, kept beside the keys at every
        # filing, settling and leaving, were ~6 % of simulate()'s bytecodes near capacity). (Negative while a quiet
        # window has given its handled rows their tokens ahead of the advance: they owe nothing.)
        self._log_tokens = array("i")  # entry i: the i-th lazy step's token ...
        self._log_times = array("d")  # ... and its time
        self._block_size = block_size
        self._caching = caching  # full blocks are offered to the prefix cache: filling one needs the block manager
        self.advance = 0  # the number of the next advance
        self.steady: dict[Sequence, int] = {}  # sequence -> the advance at which it next needs its own row handled
        self.unsteady: set[Sequence] = set()  # running sequences not filed
        self._calendar: dict[int, list[Sequence]] = {}  # advance -> sequences filed under it (stale ones skipped)
        # The batch's context sums, kept rather than read off every row each step (a pass over ~150 rows for their
        # counts, summed and maxed, was most of a large batch's scheduling): each steady sequence -> its
        # num_computed_tokens (settled: what it owes counted) less the advance, which every advance leaves unchanged
        # (each gives it one token); their sum; their largest, None when not known (recomputed then: only dropping
        # the one that holds it makes it unknown).
        self._keys: dict[Sequence, int] = {}
        self._key_sum = 0
        self._key_max: int | None = None

    def forget(self, running: list[Sequence]) -> None:
        """Nothing is known any more: every running sequence takes the general path until filed again."""
        self.settle_all()
        self.steady.clear()
        self._calendar.clear()
        self._keys = {}
        self._key_sum = 0
        self._key_max = None
        self.unsteady = set(running)

    def consistent_with(self, running: list[Sequence]) -> bool:
        """Whether every running sequence is accounted for (code that edits ``running`` directly breaks this)."""
        return len(self.steady) + len(self.unsteady) == len(running)

    def due(self) -> list[Sequence]:
        """The steady sequences whose row the coming advance must handle itself (left filed: see ``take_due``), their
        debts paid (lazy tokens): the scheduler reads their rows next."""
        advance, steady = self.advance, self.steady
        listed = self._calendar.get(advance)
        if listed is None:
            return []
        due = [seq for seq in listed if steady.get(seq) == advance]
        if self._log_times:  # (nobody owes while the log is empty)
            for seq in due:
                self.settle(seq)
        return due

    def take_due(self, due: list[Sequence]) -> None:
        """The coming advance handles the rows of ``due`` (what ``due()`` gave): they go unsteady until their row is
        postprocessed and files them again."""
        self._calendar.pop(self.advance, None)
        steady = self.steady
        for seq in due:  # (paid by due(), and nothing logged since)
            del steady[seq]
            self._drop_key(seq)
        self.unsteady.update(due)

    def decoded_in_place(self, seq: Sequence) -> None:
        """``seq``, due at the coming advance for a block event only (a block opened or filled: not its last token,
        ``due`` having paid its debts), had it handled by the scheduler (append_slots): it stays steady, a plain row of
        this advance, filed under its next event as ``file`` would file it after this advance's postprocess, one token
        on. Its key (computed less advance) is the same then; a debtor, it owes this advance's token as the others do.
        (Taken out and filed again, as a row handled by postprocess, it cost some 300 bytecodes more: ~1,500 block
        events in sharegpt's 2,000 requests at 40 req/s, ~2 % of simulate()'s.)"""
        # after this advance's token, as of the next advance
        self._file_at_next_event(seq, seq.num_computed_tokens + 1, self.advance + 1)

    def skipped(self, num_steps: int) -> None:
        """``num_steps`` decode steps of every running sequence were applied at once (engine.core.quiet_window),
        with their block events and finishes: each sequence filed under one of those steps is filed afresh."""
        start = self.advance
        end = self.advance = start + num_steps
        # Nothing to settle: a window planned row by row paid every debt before it (and nothing logged since), one
        # planned from this bookkeeping logged its steps for the sequences that keep owing (``owe_window``).
        calendar, steady = self._calendar, self.steady
        if not calendar:  # (a small batch files no sequence: each window of a fleet's replicas, mostly)
            return
        passed = range(start, end) if num_steps < len(calendar) else [a for a in calendar if start <= a < end]
        for advance in passed:
            for seq in calendar.pop(advance, ()):
                if steady.get(seq) == advance:
                    # Still running (a finish left it: ``left``), so still a plain decode: the window gave it its
                    # tokens and blocks and nothing else, and its key (computed less advance) is unchanged; what
                    # ``file`` would redo (its status, stop tokens, first token, debts, key) holds as it did. Only its
                    # next event is new, from the new advance (later than the one it leaves: never "filed already").
                    self._file_at_next_event(seq, seq.num_computed_tokens, end)

    # ---- quiet windows planned from the calendar (engine.core.quiet_window) --------------------------------------
    def covers(self, running: list[Sequence]) -> bool:
        """Whether every running sequence is steady and owes its tokens (lazy): a quiet window then needs to handle
        only the rows filed under one of its steps; the others stay plain through it and owe its tokens."""
        return self.lazy and not self.unsteady and len(self.steady) == len(running)

    def filed_within(self, first: int, end: int) -> list[tuple[int, Sequence]]:
        """The steady sequences filed under the advances ``first`` .. ``end - 1`` steps from the coming one, as (steps
        from it, sequence) in that order, their debts paid (the caller reads their rows)."""
        start, calendar, steady = self.advance, self._calendar, self.steady
        if end - first < len(calendar):
            passed = [a for a in range(start + first, start + end) if a in calendar]
        else:
            passed = sorted(a for a in calendar if start + first <= a < start + end)
        filed = []
        owing = bool(self._log_times)  # (nobody owes while the log is empty)
        for advance in passed:
            for seq in calendar[advance]:
                if steady.get(seq) == advance:
                    if owing:
                        self.settle(seq)
                    filed.append((advance - start, seq))
        return filed

    def longest_without(self, gone: set[Sequence]) -> int:
        """The largest num_computed_tokens (what is owed counted) of the steady sequences not in ``gone`` (-1: none)."""
        advance = self.advance
        return max((key for seq, key in self._keys.items() if seq not in gone), default=-1 - advance) + advance

    def owe_window(self, token_id: int, ends_s: array, handled: list[Sequence]) -> None:
        """A quiet window's steps, ending at ``ends_s``, gave every steady sequence but ``handled`` (whose rows the
        window handled itself, their tokens appended) ``token_id`` each: owed, as ``log_step`` logs a step. The
        handled ones owe nothing: their counts are the window's steps ahead of the advance, which ``skipped`` then
        moves on by as many."""
        self._log_tokens.extend(array("i", [token_id]) * len(ends_s))
        self._log_times.extend(ends_s)

    def admitted(self, seq: Sequence) -> None:
        self.unsteady.add(seq)

    def left(self, seq: Sequence) -> None:
        """``seq`` left the running list (finished, preempted, withdrawn): its debt paid."""
        if self.steady.pop(seq, None) is not None:
            if self._log_times:
                self.settle(seq)
            self._drop_key(seq)
        self.unsteady.discard(seq)

    def file(self, seq: Sequence) -> None:
        """After ``seq``'s row was postprocessed: file it under the advance at which it next needs its own row, if
        it is a plain decode until then; otherwise it stays unsteady."""
        if seq.status is not RUNNING:  # withdrawn while its step ran: not in the running list
            self.left(seq)
            return
        keys = self._keys
        old_key = keys.get(seq)  # (a key: it is steady, its row handled between advances, e.g. an ignored eos)
        if old_key is not None and self._log_times:
            self.settle(seq)  # (its row was just handled: settled already, but what follows reads it)
        computed = seq.num_computed_tokens
        # A prompt whose last token is left to compute alone looks like a decode (one token to compute), but its row
        # samples the first token, which postprocess must record (first_token_s): filed, a plain row got the token
        # without it, and the first token time read a later token's (a step-loop TTFT a step or more late, and other
        # than a quiet window's, which records it).
        steady = self.steady
        if len(seq.token_ids) - computed != 1 or seq.sampling_params.stop_token_ids or seq.first_token_s is None:
            if steady.pop(seq, None) is not None:
                self._drop_key(seq)
            self.unsteady.add(seq)
            return
        now = self.advance
        # Its key: steady from here on, it owes what the log gets next (none of what it holds now).
        key = computed - now
        if old_key != key:  # (refiled at a later advance: the same key, kept)
            if old_key is None:  # newly steady
                self.unsteady.discard(seq)
            else:
                self._drop_key(seq)
            keys[seq] = key
            self._key_sum += key
            key_max = self._key_max
            if key_max is not None and key > key_max:
                self._key_max = key
        # Filed at its advance already (its row handled between advances, e.g. an ignored eos), it stays listed once,
        # or the advance would handle its row twice. A sequence's advances only grow: they mark token positions, which
        # move only at the advance that handles them.
        self._file_at_next_event(seq, computed, now)

    def _file_at_next_event(self, seq: Sequence, computed: int, now: int) -> int:
        """File plain decode ``seq`` (``computed`` tokens computed as of advance ``now``) under the advance at which
        it next needs its own row, and return that advance: a new block opened or one filled (decode_steps_to_new_block
        and decode_steps_to_full_block, written out: this runs for every row filed), or its last token sampled; the
        earliest of them, from ``now``. The one rule for ``file``, ``decoded_in_place`` and ``skipped``."""
        block_size = self._block_size
        steps = len(seq.block_table) * block_size - computed
        if self._caching:
            to_full = (seq.num_registered_blocks + 1) * block_size - 1 - computed
            if to_full < steps:
                steps = to_full
        to_last = seq.max_num_tokens - computed - 2  # it samples its last token
        if to_last < steps:
            steps = to_last
        advance = now + steps if steps > 0 else now
        if self.steady.get(seq) == advance:  # filed there already (see ``file``): listed once
            return advance
        self.steady[seq] = advance
        listed = self._calendar.get(advance)
        if listed is None:
            self._calendar[advance] = [seq]
        else:
            listed.append(seq)
        return advance

    # ---- lazy tokens ----------------------------------------------------------------------------------------
    def log_step(self, token_id: int, now_s: float) -> None:
        """A step gave every steady sequence ``token_id`` at ``now_s``: owed, not appended (``lazy`` only; after the
        advance it counts as, which makes every steady sequence owe it)."""
        self._log_tokens.append(token_id)
        self._log_times.append(now_s)

    def settle(self, seq: Sequence) -> None:
        """Append to steady ``seq`` the tokens (and times) it owes, and count them computed: as if each lazy step had
        appended them (a no-op for a sequence that owes nothing)."""
        owed = self._keys[seq] + self.advance - seq.num_computed_tokens
        if owed > 0:
            times = self._log_times
            start = len(times) - owed
            seq.token_ids.extend(self._log_tokens[start:])
            seq.token_times_s.extend(times[start:])
            seq.num_computed_tokens += owed

    def settle_all(self) -> None:
        """Settle every steady sequence (for a reader of the whole running batch) and start afresh: nothing is
        owed until the next lazy step."""
        tokens, times = self._log_tokens, self._log_times
        if not times:
            return
        end = len(times)
        advance = self.advance
        # The debtors by what they owe (mostly a few groups: those filed at one step owe alike), each group's log
        # tail copied once: two extends and an addition a sequence (debts are paid before most quiet windows).
        tails: dict[int, tuple[array, array]] = {end: (tokens, times)}
        for seq, key in self._keys.items():
            owed = key + advance - seq.num_computed_tokens
            if owed > 0:
                tail = tails.get(owed)
                if tail is None:
                    tail = tails[owed] = (tokens[end - owed:], times[end - owed:])
                seq.token_ids.extend(tail[0])
                seq.token_times_s.extend(tail[1])
                seq.num_computed_tokens += owed
        del tokens[:]
        del times[:]

    def plain_context(self) -> tuple[int, int]:
        """(the steady sequences' num_computed_tokens summed, the largest; -1 when none is steady), what they owe
        counted: after ``take_due``, the plain rows' contexts before the coming advance's token."""
        if not self._keys:
            return 0, -1
        if self._key_max is None:
            self._key_max = max(self._keys.values())
        return self._key_sum + len(self._keys) * self.advance, self._key_max + self.advance

    def _drop_key(self, seq: Sequence) -> None:
        key = self._keys.pop(seq)
        self._key_sum -= key
        if key == self._key_max:  # (another may hold the same value: recomputed all the same)
            self._key_max = None
