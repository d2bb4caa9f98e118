"""A request as the scheduler sees it: tokens, KV-cache mapping, status and timing (torch-free)."""

from __future__ import annotations

import enum
from array import array
from bisect import bisect_left
from operator import attrgetter

from engine.core.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos or a stop token
    LENGTH = "length"  # max_tokens reached: the request got every token it asked for
    # Cut short: the request asked for more tokens than the engine lets one sequence hold.
    MAX_MODEL_LEN = "max_model_len"  # prompt + output reached max_model_len
    KV_CAPACITY = "kv_capacity"  # the sequence alone filled the whole KV cache
    TOKEN_BUDGET = "token_budget"  # nano policy: longer could not be re-prefilled in one step after a preemption
    REJECTED = "rejected"  # can never be served; see Sequence.reject_reason
    ABORTED = "aborted"  # cancelled by the caller
    ERROR = "error"  # the runner failed on this request; see Sequence.error

    @property
    def served(self) -> bool:
        """The request ran until a stop rule or a limit ended it (not rejected, aborted or failed)."""
        return self not in (FinishReason.REJECTED, FinishReason.ABORTED, FinishReason.ERROR)

    @property
    def is_cut(self) -> bool:
        """The request ended before max_tokens because of an engine limit."""
        return self in (FinishReason.MAX_MODEL_LEN, FinishReason.KV_CAPACITY, FinishReason.TOKEN_BUDGET)


# The members read per request and per row as plain module constants: under Python 3.11 a member read off its enum
# class goes through the metaclass's __getattr__ hook, some 800 instructions each (several per simulated request).
WAITING = SequenceStatus.WAITING
RUNNING = SequenceStatus.RUNNING
FINISHED = SequenceStatus.FINISHED
LENGTH = FinishReason.LENGTH
REJECTED = FinishReason.REJECTED


class Sequence:
    """One request. ``token_ids`` holds the prompt followed by the completion.

    ``num_computed_tokens`` counts tokens whose KV is in the cache (computed or hit in the prefix cache);
    the scheduler schedules ``num_tokens - num_computed_tokens`` more (1 while decoding). Times are in
    the engine clock's seconds, so the simulator and the GPU produce comparable records.
    """

    __slots__ = (
        "seq_id",
        "request_id",
        "token_ids",
        "num_prompt_tokens",
        "sampling_params",
        "max_num_tokens",
        "status",
        "finish_reason",
        "reject_reason",
        "error",
        "length_reason",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_table",
        "block_hashes",
        "num_registered_blocks",
        "arrival_s",
        "first_scheduled_s",
        "first_token_s",
        "finish_s",
        "token_times_s",
        "num_preemptions",
        "replica",
        "running_order",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: list[int] | array,
        sampling_params: SamplingParams,
        arrival_s: float = 0.0,
        request_id: object = None,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = seq_id if request_id is None else request_id
        # A list on hardware (the model runner indexes it); the simulator passes an array('i'): a quarter of a
        # list's memory, copied and hashed as raw bytes. Either way it is this sequence's own copy.
        self.token_ids: list[int] | array = (
            prompt_token_ids[:] if isinstance(prompt_token_ids, array) else list(prompt_token_ids))
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling_params = sampling_params
        # Prompt + max_tokens; the scheduler lowers it to the engine's max_seq_len when the request is added.
        self.max_num_tokens = self.num_prompt_tokens + sampling_params.max_tokens
        self.status = WAITING
        self.finish_reason: FinishReason | None = None
        self.reject_reason: str | None = None
        self.error: str | None = None  # what failed, when finish_reason is ERROR
        # The reason it finishes with once max_num_tokens is reached: LENGTH, or the limit that cut it.
        self.length_reason = LENGTH
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        # Chained hashes of this sequence's full blocks; they depend only on tokens, so they survive preemption.
        self.block_hashes: list[int] = []
        # Leading blocks of block_table already offered to the prefix cache (reset on each admission).
        self.num_registered_blocks = 0
        self.arrival_s = arrival_s
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.token_times_s = array("d")
        self.num_preemptions = 0
        self.replica = 0
        # Set by the scheduler each time it appends the sequence to its running list, from a count that only grows:
        # the running list, appended to and taken from in order, is sorted by it (the scheduler's bisection).
        self.running_order = 0

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
            f"prompt={self.num_prompt_tokens}, computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is FINISHED


_RUNNING_ORDER = attrgetter("running_order")


def index_in_running(running: list[Sequence], seq: Sequence) -> int:
    """``running.index(seq)`` (ValueError if absent) for a list in running order (a scheduler's running list, or a copy
    of it, maybe less some rows), by bisection on ``running_order``, checked, else row by row (a list edited by hand).
    Row by row, each row before it was a rich comparison (Sequence defines no equality), ~100 instructions: a large
    batch's due and finished rows, found so every step, were ~3 % of simulate()'s instructions near capacity."""
    index = bisect_left(running, seq.running_order, key=_RUNNING_ORDER)
    if index < len(running) and running[index] is seq:
        return index
    return running.index(seq)
