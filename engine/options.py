"""Options of ``engine.LLM``, validated once (torch-free). Names follow nano-vLLM and vLLM."""

from __future__ import annotations

from dataclasses import dataclass, fields

from engine.core.config import SCHEDULING_POLICIES

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "dummy")
ATTENTION_BACKENDS = ("auto", "triton", "flash_attn", "torch")


@dataclass(frozen=True)
class EngineOptions:
    model: str
    device: str = "auto"  # "cuda" when available, else "cpu"
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU
    block_size: int = 256
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    policy: str = "mixed"
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    seed: int = 0
    attention_backend: str = "auto"
    num_gpu_blocks: int | None = None  # override the KV cache size (blocks); None: sized from free memory
    max_cuda_graph_batch_size: int = 512
    distributed_backend: str = "auto"  # nccl on CUDA, gloo on CPU

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: object) -> "EngineOptions":
        known = {f.name for f in fields(cls)} - {"model"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}; supported: {', '.join(sorted(known))}")
        return cls(model=model, **kwargs)

    def __post_init__(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(self.device in ("auto", "cuda", "cpu") or self.device.startswith("cuda:"),
              f"device must be 'auto', 'cuda' or 'cpu', got {self.device!r}")
        check(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check(isinstance(self.block_size, int) and 16 <= self.block_size <= 256 and not self.block_size & (self.block_size - 1),
              f"block_size must be a power of two from 16 to 256, got {self.block_size!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size", "max_cuda_graph_batch_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
        check(self.max_model_len is None or (isinstance(self.max_model_len, int) and self.max_model_len >= 1),
              f"max_model_len must be an integer >= 1, got {self.max_model_len!r}")
        check(self.num_gpu_blocks is None or (isinstance(self.num_gpu_blocks, int) and self.num_gpu_blocks >= 1),
              f"num_gpu_blocks must be an integer >= 1, got {self.num_gpu_blocks!r}")
        check(isinstance(self.gpu_memory_utilization, (int, float)) and 0.0 < self.gpu_memory_utilization <= 1.0,
              f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        check(self.policy in SCHEDULING_POLICIES, f"policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.policy!r}")
        check(self.load_format in LOAD_FORMATS, f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        check(self.attention_backend in ATTENTION_BACKENDS,
              f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, got {self.attention_backend!r}")
        check(self.distributed_backend in ("auto", "nccl", "gloo"),
              f"distributed_backend must be 'auto', 'nccl' or 'gloo', got {self.distributed_backend!r}")
