"""The offline API as a vLLM user expects it: stop strings (include_stop_str_in_output), n samples of a
prompt, and stop_reason and per-sample outputs (engine.LLM on CPU, tiny random models)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from engine import LLM, SamplingParams  # noqa: E402
from engine.core.detokenizer import IncrementalDetokenizer  # noqa: E402
from tests.engine.test_llm_api import OPTIONS, model_with_tokenizer  # noqa: E402, F401 - the fixture
from tests.engine.test_server_api import CharTokenizer, served  # noqa: E402, F401 - the fixture

PROMPT = [1, 2, 3]
# The tiny Qwen3's greedy continuation of PROMPT, as the word tokenizer writes it (token i is "w<i>")
GREEDY_IDS = [25, 153, 472, 153, 422, 364, 413, 103, 413, 351]


def greedy(**options) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, **options)


@pytest.fixture(scope="module")
def llm(model_with_tokenizer):  # noqa: F811 - the imported fixture
    return LLM(model_with_tokenizer[0], **OPTIONS)


def test_the_greedy_continuation_these_tests_read(llm):
    [out] = llm.generate([PROMPT], greedy(), use_tqdm=False)
    assert out["token_ids"] == GREEDY_IDS
    assert out["text"] == " ".join(f"w{t}" for t in GREEDY_IDS)


@pytest.mark.parametrize(("stop", "include", "text", "num_tokens", "stop_reason"), [
    ("w472", False, "w25 w153 ", 3, "w472"),
    ("w472", True, "w25 w153 w472", 3, "w472"),
    ("153 w4", False, "w25 w", 3, "153 w4"),  # across two tokens: ends at the one that completes it
    (["w422", "w153"], False, "w25 ", 2, "w153"),  # the earliest in the text wins, whatever the list's order
    ("w999", False, " ".join(f"w{t}" for t in GREEDY_IDS), 10, None),  # never matched: max_tokens
])
def test_a_stop_string_cuts_text_and_tokens_where_it_ends(llm, stop, include, text, num_tokens, stop_reason):
    [out] = llm.generate([PROMPT], greedy(stop=stop, include_stop_str_in_output=include), use_tqdm=False)
    assert out["text"] == text
    assert out["token_ids"] == GREEDY_IDS[:num_tokens]
    assert (out["finish_reason"], out["stop_reason"]) == ("length" if stop_reason is None else "stop", stop_reason)
    assert not llm.engine.has_unfinished_requests()  # the stopped request was aborted, its blocks freed


def test_a_stop_string_ends_the_request_in_the_engine_at_once(llm):
    """Aborted in the step that completed the stop string: the steps after it run the other prompt alone."""
    llm.engine.reset()
    llm.generate([PROMPT, [4, 5]], [greedy(stop="w472"), greedy()], use_tqdm=False)
    assert llm.engine.step_log.to_arrow().column("num_seqs").to_pylist() == [2, 2, 2] + [1] * 7


def test_a_stop_token_is_the_stop_reason_and_its_text_stays_out_unless_asked(llm):
    [out] = llm.generate([PROMPT], greedy(stop_token_ids=[472]), use_tqdm=False)
    assert (out["text"], out["token_ids"], out["finish_reason"], out["stop_reason"]) == (
        "w25 w153", [25, 153, 472], "stop", 472)
    [kept] = llm.generate([PROMPT], greedy(stop_token_ids=[472], include_stop_str_in_output=True), use_tqdm=False)
    assert (kept["text"], kept["token_ids"]) == ("w25 w153 w472", [25, 153, 472])


def test_n_greedy_samples_are_identical_and_share_the_prompts_cached_blocks(llm):
    llm.engine.reset()
    prompt = list(range(1, 41))  # two full blocks of 16, and 8 tokens
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, n=3), use_tqdm=False)
    assert [o["index"] for o in out["outputs"]] == [0, 1, 2]
    assert [o["token_ids"] for o in out["outputs"]] == [out["token_ids"]] * 3
    # the first sample computed the whole prompt; the others found its two full blocks in the prefix cache
    assert sum(llm.engine.step_log.to_arrow().column("num_prefill_tokens").to_pylist()) == 40 + 8 + 8


def test_seeded_samples_are_reproducible_and_each_draws_with_the_seed_plus_its_index(llm):
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, n=3, seed=5)
    [out] = llm.generate([PROMPT], params, use_tqdm=False)
    [again] = llm.generate([PROMPT], params, use_tqdm=False)
    assert again == out
    alone = [llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=5 + k),
                          use_tqdm=False)[0]["token_ids"] for k in range(3)]
    assert [o["token_ids"] for o in out["outputs"]] == alone
    assert len({tuple(ids) for ids in alone}) == 3


def test_the_output_keeps_its_keys_and_adds_vllms(llm):
    """The existing keys keep their meaning (the first sample's), beside the prompt's ids and every sample."""
    outs = llm.generate([PROMPT, [4, 5]], [greedy(stop="w472"), greedy(n=2)], use_tqdm=False)
    assert [len(o["outputs"]) for o in outs] == [1, 2]
    for out in outs:
        assert list(out) == ["text", "token_ids", "finish_reason", "stop_reason", "error", "prompt_token_ids",
                             "outputs"]
        assert {k: out[k] for k in ("text", "token_ids", "finish_reason", "stop_reason", "error")} == {
            k: v for k, v in out["outputs"][0].items() if k != "index"}
    assert outs[0]["outputs"][0] == {"index": 0, "text": "w25 w153 ", "token_ids": [25, 153, 472],
                                     "finish_reason": "stop", "stop_reason": "w472", "error": None}
    assert [o["prompt_token_ids"] for o in outs] == [PROMPT, [4, 5]]


def test_stream_ends_a_sample_at_its_stop_string_and_names_each_sample(llm):
    events = list(llm.stream([PROMPT], greedy(stop="w472", n=2)))
    for k in (0, 1):
        mine = [e for e in events if e.sample_index == k]
        assert [t for e in mine for t in e.new_token_ids] == [25, 153, 472]
        assert [e.finished for e in mine] == [False] * (len(mine) - 1) + [True]
        assert (mine[-1].finish_reason, mine[-1].stop_reason) == ("stop", "w472")
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(("options", "message"), [
    ({"n": 0}, r"SamplingParams.n must be an int from 1 to 65536 \(each sample is a request of its own\), got 0"),
    ({"n": 2.0}, r"SamplingParams.n must be an int from 1 to 65536 \(each sample is a request of its own\), got 2.0"),
    ({"stop": ["a", ""]}, "SamplingParams.stop must hold non-empty strings, got '' in it"),
    ({"stop": 5}, "SamplingParams.stop must be a string or a list of strings, got 5"),
    ({"stop": "a\ud800"}, r"SamplingParams.stop holds an unpaired surrogate \(U\+D800\); expected Unicode text"),
    ({"include_stop_str_in_output": 1}, "SamplingParams.include_stop_str_in_output must be True or False, got 1"),
])
def test_bad_values_are_a_value_error_naming_the_field(options, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        SamplingParams(**options)


def test_stop_strings_and_vllms_none_are_kept_as_a_tuple():
    assert SamplingParams(stop="ab").stop == ("ab",)
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_stop_strings_without_a_tokenizer_are_refused(tiny_qwen3):
    llm = LLM(tiny_qwen3[0], **OPTIONS)
    with pytest.raises(ValueError, match=r"^sampling_params\.stop: stop strings need a tokenizer and .* has none; "
                                         "use stop_token_ids$"):
        llm.generate([PROMPT], greedy(stop="x"), use_tqdm=False)
    [out] = llm.generate([PROMPT], greedy(n=2), use_tqdm=False)
    assert [o["text"] for o in out["outputs"]] == [None, None]


class WordTokenizer:
    """Token i is the word WORDS[i]."""

    WORDS = ("ab", "cd", "ef")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.WORDS[i] for i in ids)


def test_the_detokenizer_keeps_the_stop_string_when_asked_and_cuts_what_follows_it():
    detokenizer = IncrementalDetokenizer(WordTokenizer(), ["bc"], include_stop_str=True)
    assert detokenizer.add([0, 1, 2]) == "abc"
    assert (detokenizer.text, detokenizer.stop_string) == ("abc", "bc")


def test_the_detokenizer_leaves_a_stop_tokens_text_out_unless_asked():
    for include, text in ((False, "abcd"), (True, "abcdef")):
        detokenizer = IncrementalDetokenizer(WordTokenizer(), include_stop_str=include)
        assert detokenizer.add([0, 1, 2], ends_with_stop_token=True) + detokenizer.finish() == text


# ---- the server: the same rules, through SamplingParams and the shared detokenizer -----------------------------------
@pytest.mark.parametrize(("body", "text", "token_ids", "stop_reason"), [
    ({"stop": ["fg"]}, "bcde", [1, 2, 3, 4, 5, 6], "fg"),
    ({"stop": ["fg"], "include_stop_str_in_output": True}, "bcdefg", [1, 2, 3, 4, 5, 6], "fg"),
    ({"stop_token_ids": [3], "include_stop_str_in_output": True}, "bcd", [1, 2, 3], 3),
])
def test_the_server_takes_include_stop_str(served, body, text, token_ids, stop_reason):  # noqa: F811
    client = served(tokenizer=CharTokenizer(), runner_kwargs={"step_s": 0.002})
    r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 30 if "stop" in body else 10,
                                             "return_token_ids": True, **body})
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["stop_reason"]) == (text, token_ids, stop_reason)


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"stop": ["x", ""]}, "stop", "stop must hold non-empty strings, got '' in it"),
    ({"min_tokens": 17}, "min_tokens", "min_tokens must be an int from 0 to max_tokens (16), got 17"),
])
def test_the_server_refuses_as_sampling_params_does(served, body, param, message):  # noqa: F811
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/completions", json={"prompt": "a", **body})
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["message"]) == (param, message)
