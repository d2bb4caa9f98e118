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
the sequences filed under one of them are filed afresh. Anything else that moves sequences other than one token
per advance (a preemption, a step cut short by the token budget, a failed step) forgets it all: the next step
takes the general path for every row and files them again.
"""

from __future__ import annotations

from engine.core.block_manager import decode_steps_to_full_block, decode_steps_to_new_block
from engine.core.sequence import Sequence, SequenceStatus


class SteadyDecodes:
    __slots__ = ("advance", "steady", "unsteady", "_calendar", "_block_size", "_caching")

    def __init__(self, block_size: int, caching: bool) -> None:
        self._block_size = block_size
        self._caching = caching  # full blocks are offered to the prefix cache: filling one needs the block manager
        self.advance = 0  # the number of the next advance
        self.steady: dict[Sequence, int] = {}  # sequence -> the advance at which it next needs its own row handled
        self.unsteady: set[Sequence] = set()  # running sequences not filed
        self._calendar: dict[int, list[Sequence]] = {}  # advance -> sequences filed under it (stale ones skipped)

    def forget(self, running: list[Sequence]) -> None:
        """Nothing is known any more: every running sequence takes the general path until filed again."""
        self.steady.clear()
        self._calendar.clear()
        self.unsteady = set(running)

    def consistent_with(self, running: list[Sequence]) -> bool:
        """Whether every running sequence is accounted for (code that edits ``running`` directly breaks this)."""
        return len(self.steady) + len(self.unsteady) == len(running)

    def due(self) -> list[Sequence]:
        """The steady sequences whose row the coming advance must handle itself (left filed: see ``take_due``)."""
        advance, steady = self.advance, self.steady
        return [seq for seq in self._calendar.get(advance, ()) if steady.get(seq) == advance]

    def take_due(self, due: list[Sequence]) -> None:
        """The coming advance handles the rows of ``due`` (what ``due()`` gave): they go unsteady until their row is
        postprocessed and files them again."""
        self._calendar.pop(self.advance, None)
        for seq in due:
            del self.steady[seq]
        self.unsteady.update(due)

    def skipped(self, num_steps: int) -> None:
        """``num_steps`` decode steps of every running sequence were applied at once (engine.core.quiet_window),
        with their block events and finishes: each sequence filed under one of those steps is filed afresh."""
        start = self.advance
        end = self.advance = start + num_steps
        calendar, steady = self._calendar, self.steady
        passed = range(start, end) if num_steps < len(calendar) else [a for a in calendar if start <= a < end]
        for advance in passed:
            for seq in calendar.pop(advance, ()):
                if steady.get(seq) == advance:
                    self.file(seq)

    def admitted(self, seq: Sequence) -> None:
        self.unsteady.add(seq)

    def left(self, seq: Sequence) -> None:
        """``seq`` left the running list (finished, preempted, withdrawn)."""
        self.steady.pop(seq, None)
        self.unsteady.discard(seq)

    def file(self, seq: Sequence) -> None:
        """After ``seq``'s row was postprocessed: file it under the advance at which it next needs its own row, if
        it is a plain decode until then; otherwise it stays unsteady."""
        if seq.status is not SequenceStatus.RUNNING:  # withdrawn while its step ran: not in the running list
            self.left(seq)
            return
        computed = seq.num_computed_tokens
        if len(seq.token_ids) - computed != 1 or seq.sampling_params.stop_token_ids:
            self.steady.pop(seq, None)
            self.unsteady.add(seq)
            return
        block_size = self._block_size
        steps = decode_steps_to_new_block(seq, block_size)
        if self._caching:
            steps = min(steps, decode_steps_to_full_block(computed, seq.num_registered_blocks, block_size))
        steps = min(steps, seq.max_num_tokens - computed - 2)  # it samples its last token
        advance = self.advance + max(steps, 0)
        # Filed there already (its row handled between advances, e.g. an ignored eos): listed once, or the advance
        # would handle its row twice. A sequence's advances only grow: they mark token positions, which move only
        # at the advance that handles them.
        if self.steady.get(seq) == advance:
            return
        self.steady[seq] = advance
        self.unsteady.discard(seq)
        calendar = self._calendar
        if advance in calendar:
            calendar[advance].append(seq)
        else:
            calendar[advance] = [seq]
