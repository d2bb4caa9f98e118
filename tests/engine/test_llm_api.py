"""engine.LLM's surface on CPU: text prompts, streaming, sampling options, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from engine import LLM, SamplingParams  # noqa: E402

# On the CPU wherever they run, as the docstring says: on the device machine 'auto' took the GPU, where the tiny model's
# bfloat16 logits tie (top_k=1 then drew among the tied tokens, not greedy's first) and each LLM left open held 90 % of
# its memory, so the next found none (the GPU's own tests are test_gpu_llm.py).
OPTIONS = dict(device="cpu", block_size=16, max_model_len=128)


@pytest.fixture(scope="module")
def model_with_tokenizer(tiny_qwen3, tmp_path_factory):
    """The tiny Qwen3 plus a word-level tokenizer: token 'w<i>' is id i, '<eos>' is the model's eos (511)."""
    path, model = tiny_qwen3
    target = tmp_path_factory.mktemp("with-tokenizer")
    shutil.copytree(path, target, dirs_exist_ok=True)
    vocab = {f"w{i}": i for i in range(500)} | {"[UNK]": 500, "<eos>": 511}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")
    fast.save_pretrained(target)
    return str(target), model


def test_text_prompts_are_tokenized_and_outputs_decoded(model_with_tokenizer):
    path, model = model_with_tokenizer
    llm = LLM(path, **OPTIONS)
    out = llm.generate(["w1 w2 w3", "w7 w8"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                       use_tqdm=False)
    with torch.no_grad():
        ref = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    assert out[0]["token_ids"] == ref[0, 3:].tolist()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    for o in out:
        assert len(o["token_ids"]) == 5
        assert o["text"] == tokenizer.decode(o["token_ids"], skip_special_tokens=True) and o["text"]


def test_stream_yields_every_token_once_in_order(tiny_qwen3):
    path, _ = tiny_qwen3
    llm = LLM(path, **OPTIONS)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (4, 7, 2)]
    expected = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    streamed = {i: [] for i in range(3)}
    finished = []
    for event in llm.stream(prompts, params):
        assert not event.finished or event.index not in finished
        streamed[event.index].extend(event.new_token_ids)
        if event.finished:
            finished.append(event.index)
            assert event.finish_reason == "length"
    assert [streamed[i] for i in range(3)] == expected
    assert sorted(finished) == [0, 1, 2]


def test_seeded_sampling_is_reproducible_and_filters_work(tiny_qwen3):
    path, _ = tiny_qwen3
    llm = LLM(path, **OPTIONS)
    prompt = [[3, 1, 4, 1, 5]]
    seeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=42)
    first = llm.generate(prompt, seeded, use_tqdm=False)[0]["token_ids"]
    # The same seed alone and beside other requests gives the same tokens.
    again = llm.generate(prompt + [[9, 9, 9]], [seeded, SamplingParams(temperature=1.0, max_tokens=12)], use_tqdm=False)
    assert again[0]["token_ids"] == first
    other = llm.generate(prompt, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=7),
                         use_tqdm=False)
    assert other[0]["token_ids"] != first
    greedy = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    top1 = llm.generate(prompt, SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)
    tiny_p = llm.generate(prompt, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=12, ignore_eos=True),
                          use_tqdm=False)
    assert top1[0]["token_ids"] == greedy[0]["token_ids"] == tiny_p[0]["token_ids"]
    # A k past the vocabulary keeps every token, even one no int64 holds (the OpenAI server passes k through).
    for k in (10**6, 2**70):
        huge_k = llm.generate(prompt, SamplingParams(temperature=0, top_k=k, max_tokens=12, ignore_eos=True),
                              use_tqdm=False)
        assert huge_k[0]["token_ids"] == greedy[0]["token_ids"]


def test_a_seeded_request_draws_the_same_tokens_whatever_runs_beside_it(tiny_qwen3):
    """Its noise follows its seed and token count alone: not its row, its batch, a companion's top-k (whose
    rows take the torch path), nor a preemption, which recomputes it from scratch."""
    path, _ = tiny_qwen3
    prompt = [3, 1, 4, 1, 5]
    seeded = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True, seed=2**40 + 17)
    with LLM(path, **OPTIONS) as llm:
        alone = llm.generate([prompt], seeded, use_tqdm=False)[0]["token_ids"]
        companions = [SamplingParams(temperature=1.0, top_k=5, max_tokens=10), SamplingParams(temperature=0.5)]
        batched = llm.generate([[7, 7], prompt, [2, 2, 2]], [companions[0], seeded, companions[1]], use_tqdm=False)
        assert batched[1]["token_ids"] == alone
    # Six blocks of KV for three requests of up to 40 tokens: the scheduler must preempt.
    with LLM(path, **{**OPTIONS, "num_gpu_blocks": 6}) as small:
        seqs = [small.engine.add_request(p, seeded) for p in ([1] * 30, prompt, [2] * 30)]
        while small.engine.has_unfinished_requests():
            small.engine.step()
    assert sum(seq.num_preemptions for seq in seqs) > 0
    assert list(seqs[1].token_ids[len(prompt):]) == alone


def test_eos_stops_unless_ignored(tiny_qwen3):
    path, _ = tiny_qwen3
    llm = LLM(path, **OPTIONS)
    greedy = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    stop_at = greedy[0]["token_ids"][2]
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(stop_at,)),
                       use_tqdm=False)
    assert out[0]["token_ids"] == greedy[0]["token_ids"][: greedy[0]["token_ids"].index(stop_at) + 1]


def test_a_stop_tokens_text_is_left_out_as_in_vllm(model_with_tokenizer):
    """The token that stopped an output is in its token_ids, not in its text (vLLM's include_stop_str_in_output
    false): a stop token of plain text ended the text."""
    llm = LLM(model_with_tokenizer[0], **OPTIONS)
    greedy = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    ids = greedy[0]["token_ids"]
    stop_at = next(t for t in ids if llm.tokenizer.decode([t]))  # a token with text of its own
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(stop_at,)),
                       use_tqdm=False)[0]
    kept = ids[: ids.index(stop_at) + 1]
    assert (out["token_ids"], out["finish_reason"]) == (kept, "stop")
    assert out["text"] == llm.tokenizer.decode(kept[:-1], skip_special_tokens=True)


def test_clear_errors(tiny_qwen3, tmp_path):
    path, _ = tiny_qwen3
    with pytest.raises(ValueError, match="unknown option.*bogus"):
        LLM(path, bogus=1)
    with pytest.raises(ValueError, match="block_size must be a power of two from 16 to 256"):
        LLM(path, block_size=8)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(path, gpu_memory_utilization=1.5)
    with pytest.raises(FileNotFoundError, match="neither a directory with a config.json nor a shipped config"):
        LLM(str(tmp_path / "nowhere"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"], "hidden_size": 8}))
    with pytest.raises(ValueError, match="unsupported architecture 'MambaForCausalLM'.*Qwen3ForCausalLM"):
        LLM(str(bad))
    llm = LLM(path, **OPTIONS)
    with pytest.raises(ValueError, match="prompt 1 has 129 tokens, more than max_model_len=128"):
        llm.generate([[1, 2], [1] * 129], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt 0 is text but .* has no tokenizer"):
        llm.generate(["hello"], use_tqdm=False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 99999]], use_tqdm=False)


def test_dummy_weights_from_a_shipped_config_name():
    llm = LLM("qwen3-0.6b", load_format="dummy", device="cpu", max_model_len=64, block_size=16, num_gpu_blocks=8,
              max_num_seqs=2)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0]["token_ids"]) == 2 and out[0]["text"] is None


@pytest.mark.parametrize(("prompts", "sampling_params", "message"), [
    # bytes were taken as token ids: b"hi" ran as [104, 105]
    (b"w1 w2", None, "prompts is b'w1 w2'; expected a string or a list of token ids, or a list of those"),
    (None, None, "prompts is None; expected a string or a list of token ids, or a list of those"),  # a TypeError
    ([[1, 2], None], None, "prompt 1 is None; expected a string or a list of token ids"),
    # a dict of options was iterated as its keys, and failed in the engine as an AttributeError
    ([[1, 2]], {"max_tokens": 2}, "sampling_params must be a SamplingParams or a list of them, got {'max_tokens': 2}"),
    ([[1, 2]], [None], "sampling_params[0] must be a SamplingParams, got None"),
    # a tokenizer's TypeError that named neither the prompt nor the character
    (["w1 \ud800"], None, "prompt 0 holds an unpaired surrogate (U+D800); expected Unicode text"),
])
def test_odd_inputs_are_value_errors_that_say_what_was_expected(model_with_tokenizer, prompts, sampling_params,
                                                                message):
    llm = LLM(model_with_tokenizer[0], **OPTIONS)
    with pytest.raises(ValueError) as info:
        llm.generate(prompts, sampling_params, use_tqdm=False)
    assert str(info.value) == message
    assert not llm.engine.has_unfinished_requests()


def test_a_generator_or_an_array_of_prompts_is_taken(tiny_qwen3):
    """A generator failed on its first index ('not subscriptable'), a numpy array of ids on its truth value."""
    import numpy as np

    llm = LLM(tiny_qwen3[0], **OPTIONS)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    expected = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]["token_ids"]
    assert llm.generate((p for p in [[1, 2, 3]]), params, use_tqdm=False)[0]["token_ids"] == expected
    assert llm.generate(np.array([1, 2, 3]), params, use_tqdm=False)[0]["token_ids"] == expected
