"""The one configuration of scheduling and KV-cache settings (torch-free): each field's default,
command-line help and the engine's limits, validated once. ``engine.options.EngineOptions`` and
``sim.config.SimConfig`` extend it, so the simulator accepts exactly what the engine accepts; CLIs
generate their options from the fields (``engine.core.config_args``). ``num_gpu_blocks`` and
``max_model_len`` may be left to be derived; the scheduler takes only a ``resolved()`` config.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

SCHEDULING_POLICIES = ("mixed", "nano")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers (blocks needed for ``a`` tokens of ``b`` per block)."""
    return -(-a // b)


def option(default: object, help: str, *, flag: str | None = None, choices: tuple | None = None,
           parse: Callable[[str], object] | None = None):
    """A config field with what its command-line option needs: help text, flag (default: --field-name), choices, and
    ``parse``, which reads the typed text as the config reads a value (a spelling the config takes, made canonical
    before argparse checks the choices): a spelling the config takes must not be refused by the command line."""
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices, "parse": parse})


class ConfigError(ValueError):
    """A setting out of its range; ``field`` names it, so a command line can name its option instead."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field


def check(ok: bool, message: str, field: str | None = None) -> None:
    if not ok:
        raise ConfigError(field, message)


def check_int(name: str, value: object, minimum: int = 1, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    check(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
          f"{name} must be an integer >= {minimum}, got {value!r}", name)


def check_choice(name: str, value: object, choices: tuple) -> None:
    check(value in choices, f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}", name)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    # The paged-attention kernels tile a block with at least 16 rows and at most 256; the block size
    # is a power of two so a token's block is a shift away.
    SUPPORTED_BLOCK_SIZES: ClassVar[tuple[int, ...]] = (16, 32, 64, 128, 256)

    policy: str = option("mixed", "scheduling policy", choices=SCHEDULING_POLICIES)
    max_num_seqs: int = option(256, "most sequences in one step")
    max_num_batched_tokens: int = option(8192, "token budget of one step")
    block_size: int = option(256, "tokens per KV block")
    num_gpu_blocks: int | None = option(None, "KV blocks per replica (default: sized from GPU memory)")
    max_model_len: int | None = option(None, "longest prompt+output in tokens (default: the model's)")
    enable_prefix_caching: bool = option(True, "disable the prefix cache", flag="--no-prefix-caching")
    gpu_memory_utilization: float = option(0.9, "share of GPU memory used")
    tensor_parallel_size: int = option(1, "GPUs per replica")
    seed: int = option(0, "seed for weights, sampling and synthesized prompt tokens")
    allow_long_max_model_len: bool = option(
        False, "accept --max-model-len beyond the model's max_position_embeddings (timing studies with dummy "
        "weights, as vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN; outputs past the trained context are unreliable)")

    # The integer settings: a numpy integer (a sweep table's row, a config read with numpy) is taken as the int it is.
    # np.int64(128) as max_model_len was refused as "must be an integer", and np.int64(16) as block_size passed its
    # check but made num_gpu_blocks a numpy integer the resolved config refused, naming num_gpu_blocks, which nobody
    # had passed.
    INTEGER_FIELDS: ClassVar[tuple[str, ...]] = ("max_num_seqs", "max_num_batched_tokens", "block_size",
                                                 "num_gpu_blocks", "max_model_len", "tensor_parallel_size", "seed")

    def _plain_ints(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if type(value) is not int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))

    # The same for the share and the switches: np.float32(0.5) as gpu_memory_utilization was refused as "must be in
    # (0, 1], got np.float32(0.5)" (not a float subclass, as np.float64 is), and np.False_ as enable_prefix_caching as
    # "must be true or false, got np.False_".
    SCALAR_FIELDS: ClassVar[tuple[str, ...]] = ("gpu_memory_utilization", "enable_prefix_caching",
                                                "allow_long_max_model_len")

    def _plain_scalars(self, names: tuple[str, ...]) -> None:
        for name in names:
            value = getattr(self, name)
            if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:  # a numpy scalar, not an array
                object.__setattr__(self, name, value.item())

    def __post_init__(self) -> None:
        self._plain_ints(EngineConfig.INTEGER_FIELDS)
        self._plain_scalars(EngineConfig.SCALAR_FIELDS)
        check_choice("policy", self.policy, SCHEDULING_POLICIES)
        for name in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            check_int(name, getattr(self, name))
        check_int("num_gpu_blocks", self.num_gpu_blocks, optional=True)
        # Block tables reach the attention kernels as int32: 2**70 blocks failed only in the KV cache's allocation.
        check(self.num_gpu_blocks is None or self.num_gpu_blocks < 2**31,
              f"num_gpu_blocks must be below 2**31 (block ids are int32 on the GPU), got {self.num_gpu_blocks}",
              "num_gpu_blocks")
        check_int("max_model_len", self.max_model_len, optional=True)
        check_int("seed", self.seed, minimum=0)
        check(self.seed < 2**63, f"seed must be below 2**63, got {self.seed}", "seed")
        sizes = self.SUPPORTED_BLOCK_SIZES
        # An int: 16.0 == 16 passed the membership test and failed in the KV cache's allocation, a torch TypeError.
        check(isinstance(self.block_size, int) and not isinstance(self.block_size, bool) and self.block_size in sizes,
              f"block_size must be a power of two from {sizes[0]} to {sizes[-1]}, got {self.block_size!r}",
              "block_size")
        for name in ("enable_prefix_caching", "allow_long_max_model_len"):
            check(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}",
                  name)
        utilization = self.gpu_memory_utilization
        check(isinstance(utilization, (int, float)) and not isinstance(utilization, bool)
              and math.isfinite(utilization) and 0.0 < utilization <= 1.0,
              f"gpu_memory_utilization must be in (0, 1], got {utilization!r}", "gpu_memory_utilization")

    @property
    def is_resolved(self) -> bool:
        return self.num_gpu_blocks is not None and self.max_model_len is not None

    def resolved(self, *, num_gpu_blocks: int, max_model_len: int):
        """This config with the KV cache size and the longest sequence filled in (same type)."""
        return dataclasses.replace(self, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_seq_len_limit(self) -> tuple[int, str]:
        """Longest a sequence may grow (prompt + output) before it is cut, and which limit that is
        (``max_model_len``, ``kv_capacity`` or ``token_budget``: a cut request's finish reason).

        Besides max_model_len, a sequence must fit the whole KV cache on its own, and under the nano
        policy (no chunked prefill) it must be re-prefillable in one step after a preemption.
        """
        limits = [(self.max_model_len, "max_model_len"), (self.kv_capacity_tokens, "kv_capacity")]
        if self.policy == "nano":
            limits.append((self.max_num_batched_tokens, "token_budget"))
        return min(limits, key=lambda limit: limit[0])  # on a tie, the first named

    @property
    def max_seq_len(self) -> int:
        return self.max_seq_len_limit[0]

    def check_model(self, shape) -> None:
        """Refuse settings the model cannot run with (a ``engine.core.model_config.ModelShape``)."""
        too_long = self.max_model_len is not None and self.max_model_len > shape.max_position_embeddings
        if too_long and not self.allow_long_max_model_len:
            raise ValueError(f"max_model_len={self.max_model_len} is more than {shape.name}'s "
                             f"max_position_embeddings={shape.max_position_embeddings} "
                             "(--allow-long-max-model-len accepts it for timing studies)")
        # The engine shards these across tensor-parallel ranks (engine.gpu.layers) and cannot split them unevenly.
        tp = self.tensor_parallel_size
        for what, count in (("attention heads", shape.num_heads), ("KV heads", shape.num_kv_heads),
                            ("intermediate size", shape.intermediate_size), ("vocab size", shape.vocab_size)):
            check(count % tp == 0, f"{shape.name}: {what} ({count}) is not divisible by tensor_parallel_size ({tp})")
