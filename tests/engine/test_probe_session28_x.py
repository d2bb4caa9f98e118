"""Probe X of session 28: engine.LLM's Python API and the engine's command lines with hostile input, on the CPU.

What the probe found (input: before -> now):

- A 0-d numpy array or torch tensor has ``__iter__`` but iterates nothing. ``generate(np.array(5))``,
  ``generate(torch.tensor([1, 2, 3]))`` (a list of 0-d tensors), ``{"prompt_token_ids": torch.tensor(5)}`` and
  ``SamplingParams(stop_token_ids=np.array(5))``: ``TypeError: iteration over a 0-d array/tensor``, naming no prompt
  or field -> a ValueError naming the prompt (or ``SamplingParams.stop_token_ids``) and what was expected.
- ``generate(prompts, "abc")``: a string was taken as a list of sampling params ("sampling_params[0] must be a
  SamplingParams, got 'a'") -> "sampling_params must be a SamplingParams or a list of them, got 'abc'".
- ``llm.close()`` (or the end of its ``with`` block) while a ``stream()`` was still open: the next event ran a step on
  the runner without a model, logged "step failed: TypeError: 'NoneType' object is not callable" with a traceback and
  ended every request as an "error" with that message -> the stream raises the RuntimeError ``generate`` raises after
  close() ("this LLM is closed ...") and aborts its requests; no step runs.
- ``LLM.warm_up(num_requests)``: "8" or None was a TypeError from a comparison, True ran one request, and 10**8
  built every prompt before the first step (memory exhausted, no error) -> a ValueError, the command lines' bound
  (0 to 10,000) and wording; ``MAX_WARMUP_REQUESTS`` now lives in engine.llm for all three.
- A model name (or ``--generation-config`` folder) with a name past 255 bytes: ``Path.is_file()`` raises on it.
  ``python -m engine.serve --model xxx...`` (300 x) was an ``OSError: [Errno 36] File name too long`` traceback, exit
  1, and so was ``--generation-config``; ``LLM("x" * 300)`` an OSError that listed no shipped config -> exit 2 with one
  line, and a FileNotFoundError listing the shipped configs (a ValueError for ``generation_config``).
- ``LLM(model, generation_config=Path(folder))`` was refused as "must be 'auto', 'vllm' or a folder holding
  generation_config.json, got PosixPath(...)" for a folder holding one (``model`` takes a Path) -> read as its str.

Probed and found sound (no change): NaN/inf/negative temperature, top_p 0 / negative / NaN / > 1 / denormal (draws the
argmax, as greedy), top_k 0 / -2 / 2**63 / 10**30 / a float, max_tokens 0 / negative / 10**30 (cut at max_model_len and
said so), seeds 2**64 - 1 / -1 / -2, stop ids out of the vocabulary, empty prompts, ids -1 / vocab_size / 10**30,
sampling params of the wrong length, prompts longer than max_model_len or the KV cache; constructor options (negative
block size, max_num_seqs 0, gpu_memory_utilization > 1 or NaN, tensor_parallel_size not dividing the heads, unknown
model names); engine.replay with a missing, non-parquet or garbage trace, --out that exists, is a file, is the trace or
holds it, is the model folder (also with --overwrite), and a trace with rows too long for the model.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from cli.engine_serve import main as serve_main  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from engine.llm import MAX_WARMUP_REQUESTS  # noqa: E402
from tests.traces.helpers import cli_error  # noqa: E402

OPTIONS = dict(device="cpu", block_size=16, max_model_len=128)
GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
SHIPPED = "llama-3.1-8b, qwen3-0.6b, qwen3-8b"
TOO_LONG = "x" * 300  # one name past the file system's 255 bytes
needs_server = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="needs fastapi ('.[serve]')")


@pytest.fixture(scope="module")
def llm(tiny_qwen3):
    return LLM(tiny_qwen3[0], **OPTIONS)


# ---- 0-d arrays and tensors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("prompts", "message"), [
    (np.array(5), "prompts is array(5); expected a string or a list of token ids, or a list of those"),
    (torch.tensor([1, 2, 3]), "prompt 0 is tensor(1); expected a string or a list of token ids"),
    ([np.array(7)], "prompt 0 is array(7); expected a string or a list of token ids"),
    ({"prompt_token_ids": torch.tensor(5)}, "prompt 0 is tensor(5); expected a string or a list of token ids"),
])
def test_a_0d_array_or_tensor_as_a_prompt_is_a_value_error(llm, prompts, message):
    with pytest.raises(ValueError) as info:
        llm.generate(prompts, GREEDY, use_tqdm=False)
    assert str(info.value) == message
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize("ids", [np.array(5), torch.tensor(5)])
def test_a_0d_array_or_tensor_as_stop_token_ids_is_a_value_error(ids):
    with pytest.raises(ValueError) as info:
        SamplingParams(stop_token_ids=ids)
    assert str(info.value) == f"SamplingParams.stop_token_ids must be a sequence of ints, got {ids!r}"


def test_one_dimensional_arrays_are_still_taken(llm):
    expected = [o["token_ids"] for o in llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)]
    got = [o["token_ids"] for o in llm.generate([np.array([1, 2, 3])], GREEDY, use_tqdm=False)]
    assert got == expected
    assert SamplingParams(stop_token_ids=np.array([5, 6])).stop_token_ids == frozenset({5, 6})


def test_a_string_as_sampling_params_is_refused_whole(llm):
    with pytest.raises(ValueError) as info:
        llm.generate([[1]], "abc", use_tqdm=False)
    assert str(info.value) == "sampling_params must be a SamplingParams or a list of them, got 'abc'"


# ---- close() while a stream is open ----------------------------------------------------------------------------------
def test_a_stream_of_a_closed_llm_raises_and_runs_no_step(tiny_qwen3, caplog):
    own = LLM(tiny_qwen3[0], **OPTIONS)
    stream = own.stream([[1, 2], [3, 4]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    first = next(stream)
    assert not first.finished
    steps = len(own.engine.step_log)
    own.close()
    rest = []
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError) as info:
        rest.extend(stream)  # the other prompt's event of the step already run, then the error
    assert [(e.index, e.finished) for e in rest] == [(1 - first.index, False)]
    assert str(info.value) == ("this LLM is closed (close() or the end of its with block released its model); create "
                               "a new LLM")
    assert len(own.engine.step_log) == steps  # no step on the runner without a model
    assert not own.engine.has_unfinished_requests()  # the stream's requests were aborted
    assert "step failed" not in caplog.text


def test_a_stream_consumed_inside_its_with_block_is_unchanged(tiny_qwen3, llm):
    with LLM(tiny_qwen3[0], **OPTIONS) as own:
        events = list(own.stream([[1, 2, 3]], GREEDY))
    assert [e.finish_reason for e in events if e.finished] == ["length"]
    tokens = [t for e in events for t in e.new_token_ids]
    assert tokens == llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0]["token_ids"]


# ---- warm_up ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", ["8", None, 2.5, True, -1, MAX_WARMUP_REQUESTS + 1, 10**8])
def test_warm_up_refuses_what_is_no_count_within_the_bound(llm, count):
    with pytest.raises(ValueError) as info:
        llm.warm_up(count)
    assert str(info.value) == f"num_requests must be an integer from 0 to 10000, got {count!r}"
    assert not llm.engine.has_unfinished_requests()


def test_warm_up_takes_numpy_counts_and_zero(llm):
    llm.warm_up(np.int64(2))
    llm.warm_up(0)
    assert len(llm.engine.step_log) == 0  # the warm-up resets the engine


# ---- names past 255 bytes --------------------------------------------------------------------------------------------
def test_a_model_name_past_255_bytes_lists_the_shipped_configs():
    with pytest.raises(FileNotFoundError) as info:
        LLM(TOO_LONG, device="cpu")
    assert str(info.value) == (f"model '{'x' * 76}... cannot be a model folder (File name too long) nor is it a "
                               f"shipped config; shipped: {SHIPPED}")


def test_a_generation_config_past_255_bytes_is_a_value_error(tiny_qwen3):
    with pytest.raises(ValueError) as info:
        LLM(tiny_qwen3[0], **OPTIONS, generation_config=TOO_LONG)
    assert str(info.value) == (f"generation_config {TOO_LONG!r} cannot be read (File name too long); expected 'auto', "
                               "'vllm' or a folder holding generation_config.json")


@needs_server
def test_engine_serve_model_name_past_255_bytes_is_one_line(capsys, no_load):  # noqa: F811
    line = cli_error(serve_main, ["--model", TOO_LONG, "--device", "cpu", "--port", "0"], capsys)
    assert line == (f"error: model '{'x' * 76}... cannot be a model folder (File name too long) nor is it a shipped "
                    f"config; shipped: {SHIPPED}")


@needs_server
def test_engine_serve_generation_config_past_255_bytes_is_one_line(tiny_qwen3, capsys, no_load):  # noqa: F811
    argv = ["--model", tiny_qwen3[0], "--device", "cpu", "--port", "0", "--generation-config", TOO_LONG]
    assert cli_error(serve_main, argv, capsys) == (f"error: --generation-config {TOO_LONG!r} cannot be read (File name "
                                                   "too long); expected 'auto', 'vllm' or a folder holding "
                                                   "generation_config.json")


# ---- generation_config as a Path -------------------------------------------------------------------------------------
def test_generation_config_may_be_a_path_as_model_may(tiny_qwen3, tmp_path):
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.5, "top_k": 7, "max_new_tokens": 9}')
    as_path = LLM(tiny_qwen3[0], **OPTIONS, generation_config=tmp_path)
    as_str = LLM(tiny_qwen3[0], **OPTIONS, generation_config=str(tmp_path))
    expected = SamplingParams(temperature=0.5, top_k=7, max_tokens=9)
    assert as_path.get_default_sampling_params() == as_str.get_default_sampling_params() == expected
