"""Scheduling limits shared by the GPU engine and the simulator (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULING_POLICIES = ("mixed", "nano")


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler may put into one step, and how much KV cache it manages.

    ``num_gpu_blocks`` is known only after the runner sized its cache (on a GPU) or the cost model
    computed it (in the simulator), so the engine builds this config once that number exists.
    """

    num_gpu_blocks: int
    max_model_len: int
    block_size: int = 256
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    policy: str = "mixed"
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("num_gpu_blocks", "max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling policy {self.policy!r}; supported: {', '.join(SCHEDULING_POLICIES)}")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_seq_len(self) -> int:
        """Longest a sequence may grow (prompt + output) before it finishes with reason ``length``.

        Besides max_model_len, a sequence must fit the whole KV cache on its own, and under the nano
        policy (no chunked prefill) it must be re-prefillable in one step after a preemption.
        """
        limit = min(self.max_model_len, self.kv_capacity_tokens)
        if self.policy == "nano":
            limit = min(limit, self.max_num_batched_tokens)
        return limit
