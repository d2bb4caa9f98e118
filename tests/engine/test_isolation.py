"""One bad request, or one failed step, never wedges the engine: faults injected at each stage of a step
(preparing inputs, one request's sampling state, the forward, sampling, the runner's output) finish the
requests they hit with finish_reason "error" and a message, free their blocks, leave nothing false in the
prefix cache, and the same engine then serves normal requests exactly as a fresh one does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import engine.gpu.model_runner as model_runner_module  # noqa: E402
from engine import LLM, SamplingParams  # noqa: E402
from engine.core.runner import RequestError  # noqa: E402

# A fixed, small KV cache: the same on CPU and on a GPU, where many engines share the device in one process.
OPTIONS = dict(block_size=16, max_model_len=256, seed=0, num_gpu_blocks=64)
# Prompts of several full blocks, sharing a 32-token prefix: a failed step must not leave its blocks'
# hashes in the prefix cache, or the retried prompts would read KV that was never written.
PROMPTS = [[(5 * i + 3) % 400 for i in range(32)] + [(7 * j + k) % 400 for k in range(20 + 9 * j)] for j in range(4)]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_qwen3):
    with LLM(tiny_qwen3[0], **OPTIONS) as llm:
        return [o["token_ids"] for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _fail_once(monkeypatch, owner, name, exc: BaseException | None = None):
    exc = exc or RuntimeError("injected fault")
    original = getattr(owner, name)
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise exc
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)
    return calls


def _assert_serves_like_new(llm, reference):
    assert llm.engine.scheduler.block_manager.num_used_blocks == 0
    assert not llm.engine.has_unfinished_requests()
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outputs] == reference
    assert {o["finish_reason"] for o in outputs} == {"length"} and {o["error"] for o in outputs} == {None}


@pytest.mark.parametrize("stage", ["prepare", "forward", "sample", "output"])
def test_a_failed_step_fails_its_batch_and_the_engine_keeps_serving(tiny_qwen3, reference, monkeypatch, stage):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    runner = llm.runner
    if stage == "prepare":
        _fail_once(monkeypatch, runner, "materialize")
    elif stage == "forward":
        _fail_once(monkeypatch, runner, "execute")
    elif stage == "sample":
        _fail_once(monkeypatch, model_runner_module, "sample")
    else:  # the runner hands back fewer tokens than the batch has sequences
        original_run = runner.run
        calls = {"n": 0}

        def short_run(batch):
            calls["n"] += 1
            output = original_run(batch)
            if calls["n"] == 1:
                output.token_ids = output.token_ids[:-1]
            return output

        monkeypatch.setattr(runner, "run", short_run)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)  # the first step holds every prompt
    assert [o["finish_reason"] for o in outputs] == ["error"] * len(PROMPTS)
    message = "tokens for" if stage == "output" else "injected fault"
    assert all(message in o["error"] for o in outputs)
    _assert_serves_like_new(llm, reference)


def test_one_request_that_cannot_be_sampled_fails_alone(tiny_qwen3, reference, monkeypatch):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    real_sampling_rows = llm.runner._sampling_rows

    def refusing_seed_13(batch, plan):  # a runner that pins its failure on one request (RequestError)
        refused = [seq for seq in batch.seqs if seq.sampling_params.seed == 13]
        if refused:
            raise RequestError(refused, "seed 13 cannot seed a generator")
        return real_sampling_rows(batch, plan)

    monkeypatch.setattr(llm.runner, "_sampling_rows", refusing_seed_13)
    params = [GREEDY, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True, seed=13), GREEDY, GREEDY]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o["finish_reason"] for o in outputs] == ["length", "error", "length", "length"]
    assert "seed 13 cannot seed a generator" in outputs[1]["error"]
    # The others, batched with it, still get exactly their tokens.
    assert [outputs[i]["token_ids"] for i in (0, 2, 3)] == [reference[i] for i in (0, 2, 3)]
    _assert_serves_like_new(llm, reference)


def test_seeds_out_of_range_are_refused_up_front():
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*64\), got 1180591620717411303424"):
        SamplingParams(seed=2**70)


def test_an_abandoned_stream_aborts_its_requests(tiny_qwen3, reference):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    stream = llm.stream(PROMPTS, SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    first = next(stream)
    assert first.new_token_ids and not first.finished
    stream.close()  # the caller walks away
    assert not llm.engine.has_unfinished_requests()
    events = list(llm.stream(PROMPTS, GREEDY))  # streaming again works (it raised KeyError before)
    assert sorted(e.index for e in events if e.finished) == [0, 1, 2, 3]
    _assert_serves_like_new(llm, reference)


def test_an_interrupted_generate_leaves_nothing_queued(tiny_qwen3, reference, monkeypatch):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    _fail_once(monkeypatch, llm.runner, "execute", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    _assert_serves_like_new(llm, reference)


def test_a_rejected_prompt_queues_none_of_its_call(tiny_qwen3, reference):
    llm = LLM(tiny_qwen3[0], **{**OPTIONS, "num_gpu_blocks": 12})  # 192 tokens of KV
    with pytest.raises(ValueError, match="prompt 1 cannot be served: prompt needs 13 KV blocks"):
        llm.generate([PROMPTS[0], [1] * 200], GREEDY, use_tqdm=False)
    _assert_serves_like_new(llm, reference)


def test_float_token_ids_are_refused_not_truncated(tiny_qwen3, reference):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    with pytest.raises(ValueError, match=r"prompt 1 has token id 2.5; expected integers"):
        llm.generate([PROMPTS[0], [1, 2.5, 3]], GREEDY, use_tqdm=False)
    _assert_serves_like_new(llm, reference)
