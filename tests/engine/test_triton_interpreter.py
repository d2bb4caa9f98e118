"""Triton kernels without a GPU: the sampling kernel (engine.gpu.layers.sampling_kernels) in Triton's interpreter
draws the torch path's tokens and compiles for sm_90; the attention warm-up launches every variant it lists.
Skipped where triton is not installed (CPU-only torch ships without it); on the GPU, test_gpu_kernels.py
checks the compiled kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
# BoundKernel binds compiled kernels, which the interpreter has none of: launch through Triton's own path.
INTERPRETED = """
import torch
import engine.gpu.triton_launch as launch
launch.BoundKernel.__call__ = (lambda self, grid, args, constexprs, num_warps=4, num_stages=None:
                               self.fn[grid](*args, **constexprs, num_warps=num_warps))
launch.Launch.__call__ = lambda self: self.kernel.fn[self.grid](*self.args, **self.constexprs,
                                                                 num_warps=self.num_warps)
# Triton 3.6's interpreter turns a runtime scalar (a loop bound) into an index with int() of a one-element array,
# which numpy >= 2.4 refuses: the index of its only element instead.
from triton.runtime import interpreter
_patch_tensor = interpreter._patch_lang_tensor
def _patch_lang_tensor(tensor, scope):
    _patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
interpreter._patch_lang_tensor = _patch_lang_tensor
"""
SAMPLING = INTERPRETED + """
from engine.gpu.layers.sampler import sample_reference
from engine.gpu.layers.sampling_kernels import gumbel_argmax
gen = torch.Generator().manual_seed(0)
for vocab, rows in ((1000, 5), (20000, 3), (9000, 4)):
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(torch.bfloat16)
    temperatures = torch.tensor([0.0, 0.6, 1.0, 1.7, 0.3][:rows])
    words = torch.randint(0, 2**32, (rows, 3), generator=gen)
    expected, got = sample_reference(logits, temperatures, words), gumbel_argmax(logits, temperatures, words)
    assert torch.equal(expected, got), (vocab, expected.tolist(), got.tolist())
print("ok")
"""

FLOORS = INTERPRETED + """
from engine.gpu.layers.sampling_kernels import filter_floors, gumbel_argmax
from tests.engine.sampling_checks import check_floors
for vocab, dtype, seed, pivots, block in ((1000, torch.float32, 1, 16, 1024), (3000, torch.bfloat16, 2, 4, 2048),
                                          (5000, torch.float32, 3, 4, 2048), (2500, torch.float32, 4, 8, 512),
                                          (1000, torch.bfloat16, 5, 4, 2048)):  # a block past the vocabulary
    check_floors(lambda *a: filter_floors(*a, pivots=pivots, block=block), gumbel_argmax, vocab, dtype, "cpu", seed)
print("ok")
"""

WARM_UP = INTERPRETED + """
from engine.gpu.attention import triton_kernels
triton_kernels._num_sms = lambda device: 132  # an H200's; the interpreter has no device to ask
cache = torch.zeros(4, 2, 16, 64, dtype=torch.bfloat16)  # 4 blocks of 16 tokens, 2 KV heads of 64
print(triton_kernels.warm_up(cache, cache, 4, 256, 8, 16))
"""


def _interpret(script: str) -> str:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_kernel_draws_the_torch_paths_tokens_in_the_interpreter() -> None:
    assert _interpret(SAMPLING) == "ok"


def test_top_k_and_top_p_floors_keep_the_reference_tokens_in_the_interpreter() -> None:
    """The floors found by the search keep what the torch path's sort keeps and draw its tokens (checks:
    tests/engine/sampling_checks.py)."""
    assert _interpret(FLOORS) == "ok"


def test_the_attention_warm_up_launches_each_variant_it_lists() -> None:
    """256-token contexts, 8 sequences, 16-token pages: one decode variant (4 ranges: a context has 4 tiles of
    64), and both prefill tile shapes with 1 and 2 key ranges: five launches, none failing."""
    from engine.gpu.attention.triton_kernels_host import reachable_decode_splits, reachable_prefill_splits

    expected = len(reachable_decode_splits(2, 256, 8, 132)) + 2 * len(reachable_prefill_splits(256, 16, 132))
    assert expected == 5
    assert _interpret(WARM_UP) == str(expected)


def test_the_kernels_compile_for_hopper_without_a_gpu() -> None:
    """Triton's compiler (LLVM and ptxas, bundled with it) builds the sampling kernels for sm_90 with no GPU present:
    a typing or lowering error shows here, not first on the device. Exact division and logarithms: the
    PTX has div.rn and no approximate lg2."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.gpu.layers import sampling_kernels as kernels

    hopper = GPUTarget("cuda", 90, 32)
    signature = {"Logits": "*bf16", "Temperatures": "*fp32", "Words": "*i64", "Floors": "*fp32",
                 "BestValues": "*fp32", "BestIndices": "*i32", "stride_row": "i32", "vocab_size": "i32",
                 "NUM_CHUNKS": "constexpr", "CHUNK": "constexpr", "BLOCK": "constexpr", "HAS_FLOORS": "constexpr"}
    for has_floors in (False, True):
        chunk = triton_compile(ASTSource(kernels._gumbel_argmax_chunk_kernel, signature,
                                         constexprs={"NUM_CHUNKS": 19, "CHUNK": 8192, "BLOCK": 1024,
                                                     "HAS_FLOORS": has_floors}),
                               target=hopper, options={"num_warps": 4})
        ptx = chunk.asm["ptx"]
        assert "div.rn.f32" in ptx and "lg2.approx" not in ptx and chunk.asm["cubin"]
    pick = triton_compile(ASTSource(kernels._pick_chunk_kernel, {"BestValues": "*fp32", "BestIndices": "*i32",
                                                                 "Out": "*i64", "NUM_CHUNKS": "constexpr",
                                                                 "CHUNKS_PAD": "constexpr"},
                                    constexprs={"NUM_CHUNKS": 19, "CHUNKS_PAD": 32}),
                          target=hopper, options={"num_warps": 1})
    assert pick.asm["cubin"]
    signature = {"Logits": "*bf16", "Temperatures": "*fp32", "TopKs": "*i64", "TopPs": "*fp32", "Floors": "*fp32",
                 "stride_row": "i32", "vocab_size": "i32", "BLOCK": "constexpr", "PIVOTS": "constexpr"}
    for num_warps in (8, 4):  # the engine's shape, at both warp counts it launches with
        floors = triton_compile(ASTSource(kernels._filter_floor_kernel, signature,
                                          constexprs={"BLOCK": kernels.FLOOR_BLOCK, "PIVOTS": kernels.FLOOR_PIVOTS}),
                                target=hopper, options={"num_warps": num_warps})
        assert floors.asm["cubin"]
