"""Attention over the paged KV cache, with backends chosen by name.

- ``triton``: default on CUDA. Our kernels: KV store, split-KV paged decode, paged prefill over a cached prefix.
- ``flash_attn``: the flash-attn package's varlen and KV-cache API, when that package is importable.
- ``torch``: a plain PyTorch (SDPA) reference; the CPU path and the yardstick for tests.
"""

from __future__ import annotations

from engine.gpu.attention.metadata import AttentionMetadata

BACKENDS = ("triton", "flash_attn", "torch")


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def default_backend(device_type: str) -> str:
    return "triton" if device_type == "cuda" else "torch"


def get_backend(name: str, device_type: str):
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; supported: {', '.join(BACKENDS)}")
    if name == "torch":
        from engine.gpu.attention.torch_backend import TorchBackend

        return TorchBackend()
    if device_type != "cuda":
        raise ValueError(f"attention backend {name!r} needs a CUDA device; use 'torch' on {device_type}")
    if name == "triton":
        from engine.gpu.attention.triton_backend import TritonBackend

        return TritonBackend()
    if not flash_attn_available():
        raise ValueError("attention backend 'flash_attn' needs the flash-attn package, which is not importable")
    from engine.gpu.attention.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


__all__ = ["AttentionMetadata", "BACKENDS", "default_backend", "get_backend", "flash_attn_available"]
