"""Mixed steps with decode attention on a side stream give the same bits as in sequence (skipped without CUDA).

The engine option ``overlap_decode_attention`` (``TritonBackend.overlap_decode``) only moves where the
kernels run; a missing wait between the streams would read an attention output before it was written,
or a K/V entry before it was stored, and the hidden states would differ (or differ from run to run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from engine import LLM  # noqa: E402


def step_benchmark():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "step.py"
    spec = importlib.util.spec_from_file_location("step_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def llm():
    engine = LLM("qwen3-0.6b", load_format="dummy", max_model_len=4096, max_num_batched_tokens=2048,
                 gpu_memory_utilization=0.3, overlap_decode_attention=True)
    yield engine
    engine.close()


@pytest.mark.parametrize("num_chunks,prefix,num_decode", [(1, 0, 40), (3, 0, 7), (2, 512, 100)])
def test_overlapped_decode_attention_gives_the_same_hidden_states(llm, num_chunks, prefix, num_decode):
    step = step_benchmark()
    runner = llm.runner
    assert runner.backend.overlap_decode, "the option reached the backend"
    plan = step.mixed_plan(runner, 2048, num_chunks, prefix, num_decode, (100, 1500), seed=num_chunks)
    plan.piecewise_size = runner.piecewise.bucket(len(plan.ids))
    assert plan.piecewise_size
    outputs = {}
    try:
        for overlap in (False, True, False, True):
            runner.backend.overlap_decode = overlap
            with torch.inference_mode():
                inputs = runner.materialize(plan)
                hidden = step.forward(runner, inputs).clone()
            torch.cuda.synchronize()
            outputs.setdefault(overlap, []).append(hidden)
    finally:
        runner.backend.overlap_decode = True
    sequential, overlapped = outputs[False], outputs[True]
    assert torch.equal(sequential[0], sequential[1])
    assert torch.isfinite(sequential[0].float()).all()
    assert torch.equal(overlapped[0], sequential[0])
    assert torch.equal(overlapped[1], sequential[0])
