"""The HTTP API over the real step loop in its own process, with a scripted runner (no torch): requests join the
loop, errors are OpenAI-style 400s, an overloaded queue answers 503, a client that leaves frees its blocks, stop
strings end a choice, metrics parse with Prometheus' own parser, a dead engine fails health."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.llm_engine import LLMEngine  # noqa: E402
from engine.core.runner import RequestError, RunnerOutput  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.server.api import build_app  # noqa: E402
from engine.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES  # noqa: E402
from engine.server.engine_client import EngineClient  # noqa: E402
from engine.server.engine_process import StepStats, Update  # noqa: E402

VOCAB = 100
EOS = 99


class ScriptedRunner:
    """Samples token ``(last token + 1) % 90`` for each sequence (so outputs depend on the prompt), after
    ``step_s`` of sleep; a sequence whose prompt starts with ``fail_token`` fails its step; while the file
    ``gate`` exists, steps wait (the test holds the engine mid-step from its own process)."""

    def __init__(self, step_s: float = 0.0, fail_token: int | None = None, gate: str | None = None) -> None:
        self.step_s = step_s
        self.fail_token = fail_token
        self.gate = gate
        self.released: list[int] = []

    def run(self, batch) -> RunnerOutput:
        while self.gate is not None and os.path.exists(self.gate):
            time.sleep(0.005)
        if self.step_s:
            time.sleep(self.step_s)
        bad = [s for s in batch.seqs if s.token_ids[0] == self.fail_token]
        if bad:
            raise RequestError(bad, "scripted failure")
        return RunnerOutput([(s.token_ids[-1] + 1) % 90 for s in batch.seqs])

    def release(self, seqs) -> None:
        self.released.extend(s.seq_id for s in seqs)


class CharTokenizer:
    """Token i is the character chr(ord('a') + i % 26); a chat template joins the messages."""

    chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    eos_token_id = EOS

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [(ord(c) - ord("a")) % 26 for c in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids if i != EOS)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs) -> str:
        return "".join(m["content"] for m in messages)


class Exploding(ScriptedRunner):
    def run(self, batch):
        raise SystemExit("the device went away")  # not an Exception: the step body cannot contain it


def scripted_llm(runner_cls, runner_kwargs: dict, config: dict) -> SimpleNamespace:
    """The engine process's factory (module level, so the spawned process can import it)."""
    num_gpu_blocks = config.pop("num_gpu_blocks", 32)
    cfg = EngineConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 16,
                          **config}).resolved(num_gpu_blocks=num_gpu_blocks, max_model_len=256)
    engine = LLMEngine(cfg, runner_cls(**runner_kwargs), eos_token_ids=[EOS])
    return SimpleNamespace(engine=engine, shape=SimpleNamespace(vocab_size=VOCAB), model_dir="scripted")


@pytest.fixture
def served():
    """Start a scripted engine process behind the app; returns a test client."""
    clients = []

    def start(runner_cls=ScriptedRunner, tokenizer=None, max_waiting_requests=1000, runner_kwargs=None,
              max_request_body_bytes=DEFAULT_MAX_REQUEST_BODY_BYTES, **config):
        engine = EngineClient(functools.partial(scripted_llm, runner_cls, runner_kwargs or {}, config),
                              model_name="m", max_waiting_requests=max_waiting_requests)
        engine.start(timeout_s=60)
        client = TestClient(build_app(engine, tokenizer, max_request_body_bytes=max_request_body_bytes))
        client.engine_client = engine
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def wait_until_idle(client, timeout_s: float = 5.0) -> dict[str, float]:
    """The metrics once nothing runs or waits (an abort lands at the engine's next step boundary)."""
    deadline = time.time() + timeout_s
    while True:
        m = metric_samples(client)
        if (m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0) or time.time() > deadline:
            return m
        time.sleep(0.02)


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    out, last = [], prompt[-1]
    for _ in range(n):
        last = (last + 1) % 90
        out.append(last)
    return out


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_samples(client) -> dict[str, float]:
    text = client.get("/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_completion_tokens_usage_and_models(served) -> None:
    client = served()
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models").json()["data"][0]["id"] == "m"
    r = client.post("/v1/completions", json={"model": "m", "prompt": [5, 6, 7], "max_tokens": 5,
                                             "ignore_eos": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["token_ids"] == [8, 9, 10, 11, 12]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == 8


def test_vllm_extensions_at_their_inert_values_are_accepted(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2, "min_p": 0, "skip_special_tokens": True,
                                             "include_stop_str_in_output": False, "guided_json": None,
                                             "allowed_token_ids": None})
    assert r.status_code == 200, r.text
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 2,
                                                  "continue_final_message": False, "echo": False, "documents": None})
    assert r.status_code == 200, r.text


def test_a_huge_top_k_keeps_every_token(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2, "top_k": 2**70, "temperature": 0,
                                             "return_token_ids": True})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == [6, 7]


def test_several_prompts_and_n_give_one_choice_each(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": [[1, 2], [40, 41, 42]], "max_tokens": 3, "n": 2,
                                             "return_token_ids": True})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["token_ids"] for c in choices] == [[3, 4, 5], [3, 4, 5], [43, 44, 45], [43, 44, 45]]
    assert r.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17,
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_stream_sends_one_chunk_per_token_then_usage_then_done(served) -> None:
    client = served(tokenizer=CharTokenizer())
    with client.stream("POST", "/v1/completions", json={
            "prompt": "abc", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "defg"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all(c["usage"] is None for c in chunks)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(served) -> None:
    """stream_options.continuous_usage_stats was accepted and ignored: every chunk said usage null."""
    client = served(tokenizer=CharTokenizer())
    with client.stream("POST", "/v1/completions", json={
            "prompt": "abc", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as r:
        events = sse_events(r)
    chunks, usage = events[:-2], events[-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "def"
    assert [c["usage"] for c in chunks] == [{"prompt_tokens": 3, "completion_tokens": k, "total_tokens": 3 + k,
                                             "prompt_tokens_details": {"cached_tokens": 0}} for k in (1, 2, 3)]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3


def test_continuous_usage_says_the_cached_prompt_tokens_from_the_first_chunk(served) -> None:
    """A prompt served from the prefix cache: every chunk but the last said cached_tokens 0 (the count came only with
    the choice's last update), the last 16."""
    client = served()
    body = {"prompt": list(range(1, 21)), "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    client.post("/v1/completions", json={**body, "stream": False, "stream_options": None})  # fills the cache
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r)
    assert [e["usage"]["prompt_tokens_details"]["cached_tokens"] for e in events[:-1]] == [16] * 4


def test_chat_stream_starts_with_the_role(served) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 3})
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "cde"}
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "ab"}], "max_tokens": 3, "stream": True}) as r:
        events = sse_events(r)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == "cde"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_a_stop_string_ends_the_choice_and_frees_its_blocks(served) -> None:
    client = served(tokenizer=CharTokenizer(), runner_kwargs={"step_s": 0.01})
    r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 200, "stop": ["fg"]})
    choice = r.json()["choices"][0]
    assert choice["text"] == "bcde" and choice["finish_reason"] == "stop"
    assert r.json()["usage"]["prompt_tokens"] == 1
    m = wait_until_idle(client)
    assert m["vllm:kv_cache_usage_perc"] == 0
    assert m["vllm:request_success_total{finished_reason=stop}"] == 1  # as vLLM counts a stop string's end
    assert "vllm:request_success_total{finished_reason=abort}" not in m


def test_tokens_after_a_stop_string_are_not_counted(served) -> None:
    """The engine runs a step or two more before the stop's abort reaches it; the tokens of those steps are not part
    of the choice (they once appeared in its token_ids and in usage)."""
    client = served(tokenizer=CharTokenizer(), runner_kwargs={"step_s": 0.02})
    body = {"prompt": ["a", "m"], "max_tokens": 15, "stop": ["fg"], "return_token_ids": True}
    r = client.post("/v1/completions", json=body)
    choices = r.json()["choices"]
    assert [c["text"] for c in choices] == ["bcde", "nopqrstuvwxyzab"]
    assert [c["finish_reason"] for c in choices] == ["stop", "length"]
    assert choices[0]["token_ids"] == [1, 2, 3, 4, 5, 6]  # up to the 'g' that completed the stop string
    assert r.json()["usage"]["completion_tokens"] == 6 + 15


def test_a_stop_tokens_text_is_left_out_of_the_answer_as_in_vllm(served) -> None:
    """stop_token_ids end a choice with the token's text left out (vLLM's include_stop_str_in_output false, the only
    setting here): a stop token of plain text was at the answer's end. It stays in token_ids and the usage."""
    client = served(tokenizer=CharTokenizer())
    body = {"prompt": "a", "max_tokens": 10, "stop_token_ids": [4], "return_token_ids": True}
    r = client.post("/v1/completions", json=body)
    choice = r.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["token_ids"]) == ("bcd", "stop", [1, 2, 3, 4])
    assert r.json()["usage"]["completion_tokens"] == 4
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = sse_events(r)
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "bcd"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def hf_tokenizer():
    """A real Hugging Face fast tokenizer (word level, built here offline) with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}world{% endif %}{% if shout %} hello{% endif %}")
    return tokenizer


def test_chat_template_kwargs_reach_the_template_and_may_set_add_generation_prompt(served) -> None:
    """As in vLLM, chat_template_kwargs are the template's variables and override add_generation_prompt; that one
    was a 400 ('apply_chat_template() got multiple values for keyword argument')."""
    pytest.importorskip("transformers")
    client = served(tokenizer=hf_tokenizer())

    def prompt_tokens(**fields) -> int:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}],
                                                      "max_tokens": 1, **fields})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens() == 2  # hello world
    assert prompt_tokens(add_generation_prompt=False) == 1
    assert prompt_tokens(chat_template_kwargs={"add_generation_prompt": False}) == 1
    assert prompt_tokens(chat_template_kwargs={"shout": True}) == 3


@pytest.mark.parametrize("fields", [{"chat_template_kwargs": {"chat_template": "{{ messages[0]['content'] }}"}},
                                    {"chat_template": "{{ messages[0]['content'] }}"}])
def test_a_client_chat_template_is_refused(served, fields) -> None:
    """A template of the client's ran in the server's event loop: two nested loops of 99,999 held every other request
    (and /health) for hours; at the top level it was ignored, rendering with the model's template instead. vLLM also
    refuses one unless started with --trust-request-chat-template."""
    pytest.importorskip("transformers")
    client = served(tokenizer=hf_tokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "chat templates from the request are not accepted" in error["message"]
    assert error["param"] == next(iter(fields))


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "hello \ud800 world"}, "prompt"),
    ("/v1/completions", {"prompt": ["hello", "\udfff"]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello \ud800"}]}, "messages"),
    ("/v1/completions", {"prompt": "hello", "stop": ["x", "\ud800"]}, "stop"),  # could never match: was served
])
def test_an_unpaired_surrogate_is_a_400(served, path, body, param) -> None:
    """JSON can escape half a surrogate pair; the tokenizer raised a TypeError, answered as a 500."""
    pytest.importorskip("transformers")
    client = served(tokenizer=hf_tokenizer())
    raw = json.dumps({**body, "max_tokens": 2})  # ASCII, the surrogate escaped as a client sends it: "\\ud800"
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "unpaired surrogate" in r.json()["error"]["message"] and r.json()["error"]["param"] == param
    ok = client.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


class SlowLongTokenizer(CharTokenizer):
    """Tokenizes a long text slowly, releasing the GIL as Hugging Face's Rust tokenizers do (4 MB took 10 s)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > 100_000:
            time.sleep(3.0)
        return super().encode(text, add_special_tokens)


def _others_wait_beside(client, path: str, body: dict, after_s: float):
    """Post ``body`` to ``path`` on a thread and, ``after_s`` later, ask /health and a small completion: returns the
    big request's answer and how long the other two waited (each answered as it should)."""
    import threading

    answers = []
    thread = threading.Thread(target=lambda: answers.append(client.post(path, json={**body, "max_tokens": 2})))
    thread.start()
    time.sleep(after_s)
    start = time.monotonic()
    assert client.get("/health").status_code == 200
    other = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
    waited_s = time.monotonic() - start
    thread.join()
    assert other.status_code == 200 and other.json()["choices"][0]["text"] == "de"
    return answers[0], waited_s


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_huge_prompt_does_not_stall_other_requests(served, path) -> None:
    """Tokenizing ran in the event loop: while one client's megabytes were encoded, /health and every stream
    waited. Long texts are encoded on a worker thread; the huge prompt still gets its 400."""
    client = served(tokenizer=SlowLongTokenizer())
    text = "ab" * 100_000
    body = {"prompt": text} if path == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    answer, waited_s = _others_wait_beside(client, path, body, 0.3)  # while the huge prompt is tokenized
    assert waited_s < 2.0, waited_s  # the huge prompt holds a stalled loop for 2.7 s more (margin for a loaded CI)
    assert answer.status_code == 400 and "more than max_model_len=256" in answer.json()["error"]["message"]


class SlowEachTokenizer(CharTokenizer):
    """Every encode of a text starting with "slow" takes 3 ms (GIL released, as Hugging Face's Rust tokenizers do):
    1,000 short prompts take 3 s, none of them long; a chat template renders 300 messages in 3 s (Jinja holds the
    GIL, but the loop still runs between the thread's bytecodes)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text.startswith("slow"):
            time.sleep(0.003)
        return super().encode(text, add_special_tokens)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs) -> str:
        if len(messages) > 256:
            time.sleep(3.0)
        return super().apply_chat_template(messages, tokenize, add_generation_prompt, **kwargs)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_many_short_prompts_or_messages_do_not_stall_other_requests(served, path) -> None:
    """Only a single text over 20,000 characters went to a worker thread: 4,096 prompts of 500 characters (2 MB)
    were tokenized in the event loop, and 200,000 chat messages rendered there, holding /health and every stream
    for 3 s and 2 s on a 2-core host. A request's texts (or its messages) are counted together now."""
    from engine.server.api import THREAD_RENDER_MESSAGES, THREAD_TOKENIZE_CHARS

    client = served(tokenizer=SlowEachTokenizer())
    if path == "/v1/completions":
        prompts = ["slow" + "a" * 26] * 999 + ["slow" + "b" * 300]  # 30,300 characters; the last one too long
        assert sum(map(len, prompts)) > THREAD_TOKENIZE_CHARS and max(map(len, prompts)) < THREAD_TOKENIZE_CHARS
        body = {"prompt": prompts}
    else:
        body = {"messages": [{"role": "user", "content": "ab"}] * (THREAD_RENDER_MESSAGES + 44)}  # 600 tokens
    answer, waited_s = _others_wait_beside(client, path, body, 0.5)  # while tokenized, or the template rendered
    assert waited_s < 1.5, waited_s  # a stalled loop holds it 2.5 s more (margin for a loaded CI)
    error = answer.json()["error"]
    assert answer.status_code == 400 and "more than max_model_len=256" in error["message"], error
    assert error["message"].startswith("prompt 999 cannot" if path == "/v1/completions" else "messages (as the chat")


@pytest.mark.parametrize(("fields", "param", "message"), [
    # a rendered chat prompt was "prompt 0", param "prompt": a field chat requests do not have
    ({"messages": [{"role": "user", "content": "ab" * 150}]}, "messages",
     "messages (as the chat template renders them) cannot be served: prompt has 300 tokens, more than "
     "max_model_len=256"),
    ({"messages": [{"role": "user", "content": "ab" * 128}], "max_tokens": None}, "messages",
     "messages (as the chat template renders them) has 256 tokens, which leaves no room to generate within "
     "max_model_len=256"),
    # the limit set with max_completion_tokens was named max_tokens, a field the client had not sent
    ({"max_completion_tokens": 0}, "max_completion_tokens", "max_completion_tokens must be >= 1, got 0"),
    ({"max_completion_tokens": 1000}, "max_completion_tokens",
     "this model's maximum context length is 256 tokens; the request asks for 1002 (2 in the prompt, "
     "max_completion_tokens=1000 to generate)"),
    ({"max_tokens": 1000}, "max_tokens",
     "this model's maximum context length is 256 tokens; the request asks for 1002 (2 in the prompt, "
     "max_tokens=1000 to generate)"),
])
def test_chat_errors_name_the_fields_the_client_sent(served, fields, param, message) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == param


@pytest.mark.parametrize(("body", "param", "fragment"), [
    ({}, None, "prompt"),
    ({"prompt": [1, 2.5]}, "prompt", "a list of token ids"),
    ({"prompt": [1, True]}, "prompt", "a list of token ids"),
    ({"prompt": [[1], "a"]}, "prompt", "a list of token ids"),
    ({"prompt": 5}, "prompt", "a list of token ids"),
    ({"prompt": None}, "prompt", "a list of token ids"),
    ({"prompt": [[]]}, "prompt", "empty"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": [1, 2, 300]}, "prompt", "outside the vocabulary"),
    ({"prompt": [1], "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"prompt": [1], "max_tokens": 1000}, "max_tokens", "maximum context length is 256"),
    ({"prompt": [1], "temperature": -1}, "temperature", "temperature"),
    ({"prompt": [1], "top_p": 0}, "top_p", "top_p"),
    ({"prompt": [1], "n": 0}, "n", "n must be"),
    ({"prompt": [1], "logprobs": 2}, "logprobs", "not supported"),
    ({"prompt": [1], "presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ({"prompt": [1], "stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
    # vLLM extensions this engine lacks were ignored: other output than the client asked for, without a word
    ({"prompt": [1], "min_p": 0.2}, "min_p", "min_p is not supported"),
    ({"prompt": [1], "guided_json": {"type": "object"}}, "guided_json", "not supported"),
    ({"prompt": [1], "skip_special_tokens": False}, "skip_special_tokens", "not supported"),
    ({"prompt": [1], "allowed_token_ids": [1, 2]}, "allowed_token_ids", "allowed_token_ids is not supported"),
    ({"prompt": "text"}, "prompt", "no tokenizer"),
    ({"prompt": [1], "stop": "x"}, "stop", "tokenizer"),
    # each token searched the text for every stop string, in the event loop: 100,000 held /health for seconds
    ({"prompt": [1], "stop": [f"s{i}" for i in range(65)]}, "stop", "stop has 65 strings; at most 64 are accepted"),
    ({"prompt": [1], "seed": -3}, "seed", "seed"),
    ({"prompt": [1], "seed": 2**64}, "seed", "seed"),
    ({"prompt": [1], "top_k": -2}, "top_k", "top_k"),
    ({"prompt": [1], "n": 5000}, "n", "queues at most 1000"),
    ({"prompt": [1], "stop_token_ids": [10**20]}, "stop_token_ids", "outside the vocabulary"),
    ({"prompt": list(range(1, 90)) * 3}, "prompt", "more than max_model_len=256"),
    # max_model_len tokens and no max_tokens: nothing can be generated (the message once spoke of max_tokens 0)
    ({"prompt": list(range(1, 65)) * 4, "max_tokens": None}, "prompt",
     "prompt 0 has 256 tokens, which leaves no room to generate within max_model_len=256"),
])
def test_bad_requests_get_400_with_a_message(served, body, param, fragment) -> None:
    client = served()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert fragment in error["message"]
    if param is not None:
        assert error["param"] == param
    assert "Traceback" not in r.text


def test_malformed_json_unknown_model_and_routes(served) -> None:
    client = served()
    r = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": "other", "prompt": [1]})
    assert r.status_code == 404 and "'other' does not exist" in r.json()["error"]["message"]
    assert client.get("/v1/nothing").status_code == 404
    r = client.get("/v1/completions")  # a client's mistake, not the server's: it was typed 'internal_error'
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"] == "GET is not allowed on /v1/completions; use POST"  # was "Method Not Allowed"
    assert r.headers["allow"] == "POST"
    assert client.head("/health").status_code == 200  # a load balancer's check: it was a 405
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]


def test_a_request_that_can_never_fit_the_cache_is_rejected_with_the_reason(served) -> None:
    client = served(num_gpu_blocks=2)
    r = client.post("/v1/completions", json={"prompt": list(range(1, 60)), "max_tokens": 2})
    assert r.status_code == 400
    assert "needs 4 KV blocks of 16 tokens, the cache has 2" in r.json()["error"]["message"]


def test_an_overloaded_queue_answers_503(served, tmp_path) -> None:
    gate = tmp_path / "gate"
    gate.touch()  # the engine waits inside its first step: nothing leaves the queue
    client = served(runner_kwargs={"gate": str(gate)}, max_waiting_requests=2, max_num_seqs=1)
    engine = client.engine_client
    params = [SamplingParams(max_tokens=2)]
    engine.submit([[1, 2]], params)
    engine.submit([[3, 4]], params)
    r = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2})
    assert r.status_code == 503
    assert r.json()["error"]["message"] == ("the server is overloaded: 2 requests are waiting, the limit is 2 "
                                            "(--max-waiting-requests); retry later")
    gate.unlink()
    deadline = time.time() + 10
    while time.time() < deadline:  # the queue drains, and the server takes requests again
        r = client.post("/v1/completions", json={"prompt": [5], "max_tokens": 2})
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert r.status_code == 200


def test_a_client_that_leaves_mid_stream_frees_its_blocks(served) -> None:
    client = served(runner_kwargs={"step_s": 0.005})
    with client.stream("POST", "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 200, "stream": True,
                                                        "ignore_eos": True}) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
        assert metric_samples(client)["vllm:kv_cache_usage_perc"] > 0
    m = wait_until_idle(client)  # closing the response disconnects; the abort lands at the next step boundary
    assert m["vllm:kv_cache_usage_perc"] == 0
    assert m["vllm:request_success_total{finished_reason=abort}"] == 1
    assert m["vllm:generation_tokens_total"] < 200


def test_a_failing_request_errors_alone(served) -> None:
    client = served(runner_kwargs={"fail_token": 13})
    r = client.post("/v1/completions", json={"prompt": [13, 1], "max_tokens": 3})
    assert r.status_code == 500
    assert "scripted failure" in r.json()["error"]["message"] and "Traceback" not in r.text
    with client.stream("POST", "/v1/completions", json={"prompt": [13, 2], "max_tokens": 3, "stream": True}) as r:
        events = sse_events(r)
    assert "scripted failure" in events[0]["error"]["message"] and events[-1] == "[DONE]"
    ok = client.post("/v1/completions", json={"prompt": [4], "max_tokens": 2, "return_token_ids": True})
    assert ok.json()["choices"][0]["token_ids"] == [5, 6]


def test_metrics_count_what_was_served(served) -> None:
    client = served()
    for prompt in ([1, 2, 3], [10, 11]):
        client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4})
    m = metric_samples(client)
    assert m["vllm:request_success_total{finished_reason=length}"] == 2
    assert m["vllm:generation_tokens_total"] == 8
    assert m["vllm:prompt_tokens_total"] == 5
    assert m["vllm:time_to_first_token_seconds_count"] == 2
    assert m["vllm:inter_token_latency_seconds_count"] == 6
    assert m["vllm:e2e_request_latency_seconds_count"] == 2
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0
    assert m["vllm:prefix_cache_queries_total"] == 5


def test_a_dead_engine_loop_fails_health_and_open_requests(served) -> None:
    client = served(Exploding)
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2})
    assert r.status_code == 500 and "the device went away" in r.json()["error"]["message"]
    assert client.get("/health").status_code == 503
    assert client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2}).status_code == 503


def test_an_output_cut_by_the_cache_says_so(served) -> None:
    client = served(num_gpu_blocks=4)  # 64 tokens of KV: a 10-token prompt can grow to 64 at most
    body = {"prompt": list(range(1, 11)), "max_tokens": 100, "ignore_eos": True, "return_token_ids": True}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["cut_by"] == "kv_capacity"
    assert len(choice["token_ids"]) == 54
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        chunks = [e for e in sse_events(r) if e != "[DONE]"]
    assert [c["choices"][0].get("cut_by") for c in chunks] == [None] * 53 + ["kv_capacity"]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 54  # each chunk carries its new tokens


class FirstEncodeMutatesTokenizer(CharTokenizer):
    """As a Hugging Face tokenizer shipped with truncation set: its first encode rewrites that setting, and two first
    encodes at once (long texts on worker threads) fail with "Already borrowed"."""

    def __init__(self) -> None:
        self.settled = False

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not self.settled:
            time.sleep(0.2)  # the rewrite, during which a second caller collides
            self.settled = True
        return super().encode(text, add_special_tokens)


def test_the_tokenizer_settles_before_the_first_request(served) -> None:
    tokenizer = FirstEncodeMutatesTokenizer()
    client = served(tokenizer=tokenizer)
    assert tokenizer.settled  # build_app encoded once: requests only ever meet a settled tokenizer
    assert client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2}).status_code == 200


def _client_without_a_process(sent: list) -> EngineClient:
    """An EngineClient whose engine process is faked: commands land in ``sent``, messages are fed to _on_message."""
    client = EngineClient(lambda: None, model_name="m", max_waiting_requests=10)
    client._process = SimpleNamespace(is_alive=lambda: True)
    client._commands = SimpleNamespace(send=sent.append)
    return client


def _step(client: EngineClient, *updates) -> None:
    client._on_message(("step", 2, StepStats(0, 0, 0.0, 0, 0, 0, 0), [dataclasses.astuple(u) for u in updates]))


def _success_counts(client: EngineClient) -> dict[str, float]:
    return {s.labels["finished_reason"]: s.value for s in client.metrics._success.collect()[0].samples
            if s.name.endswith("_total")}


def test_an_aborted_choices_final_update_in_flight_is_not_counted_twice() -> None:
    """The server counts a choice it aborts at once; the engine may have finished it in the step the abort missed, and
    that update was counted again (and the stream's unfinished count went one too low)."""
    sent = []
    client = _client_without_a_process(sent)
    stream = client.submit([[1, 2], [3, 4]], [None, None])
    client.abort(stream, 0, reason="stop")  # a stop string ended choice 0
    _step(client, Update(stream.key, 0, [9], True, "length", num_prompt_tokens=2))  # in flight when the abort was sent
    client._on_message(("aborted", stream.key, 0))
    _step(client, Update(stream.key, 1, [9], True, "length", num_prompt_tokens=2))
    assert _success_counts(client) == {"stop": 1.0, "length": 1.0}
    assert stream.num_unfinished == 0 and client._aborted == {}
    assert sent[-1] == ("abort", stream.key, 0)


def test_a_choices_abort_acknowledged_after_the_whole_request_was_aborted_keeps_the_rest_uncounted() -> None:
    """A stop string aborted choice 0, then the client left (the whole request): the first acknowledgement must not
    end the bookkeeping of the second, whose choice 1 may still have a final update on its way."""
    client = _client_without_a_process([])
    stream = client.submit([[1, 2], [3, 4]], [None, None])
    client.abort(stream, 0, reason="stop")
    client.abort(stream)
    client._on_message(("aborted", stream.key, 0))
    assert client._aborted == {stream.key: None}
    _step(client, Update(stream.key, 1, [9], True, "length"))
    client._on_message(("aborted", stream.key, None))
    assert _success_counts(client) == {"stop": 1.0, "abort": 1.0} and client._aborted == {}


@pytest.mark.parametrize(("body", "param", "message"), [
    # pydantic's lax mode took these: "5" and 5.0 as 5, true as 1 token, any non-empty string as stream=true
    ({"prompt": [1], "max_tokens": "5"}, "max_tokens", "invalid request: max_tokens: Input should be a valid integer"),
    ({"prompt": [1], "max_tokens": 5.0}, "max_tokens", "invalid request: max_tokens: Input should be a valid integer"),
    ({"prompt": [1], "max_tokens": True}, "max_tokens", "invalid request: max_tokens: Input should be a valid integer"),
    ({"prompt": [1], "stream": "no"}, "stream", "invalid request: stream: Input should be a valid boolean"),
    ({"prompt": [1], "temperature": "0.5"}, "temperature", "invalid request: temperature: Input should be a valid "
                                                           "number"),
    ({"prompt": [1], "stream": True, "stream_options": {"include_usage": 1}}, "stream_options",
     "invalid request: stream_options.include_usage: Input should be a valid boolean"),
])
def test_values_of_the_wrong_json_type_are_refused_and_named(served, body, param, message) -> None:
    client = served()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == param


def test_an_int_still_passes_where_a_float_is_expected(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2, "temperature": 0, "top_p": 1})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("content", "headers", "message"), [
    (b"", {"content-type": "application/json"}, "the request body is empty; expected a JSON object"),
    (b"[1, 2]", {"content-type": "application/json"}, "the request body must be a JSON object, got an array"),
    (b'{"prompt": [1]}', {"content-type": "application/x-www-form-urlencoded"},  # curl -d without -H
     "the request body is not read as JSON: send it with Content-Type: application/json"),
    (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", {"content-type": "application/json"},
     "the request body could not be parsed as JSON: arrays or objects nested too deeply"),
    # These two were said to be nested too deeply as well.
    (b'{"prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}", {"content-type": "application/json"},
     "the request body could not be parsed as JSON: a number of more than 4300 digits"),
    (b'{"prompt": "\xff"}', {"content-type": "application/json"},
     "the request body could not be parsed as JSON: not UTF-8 text (byte ff at 12)"),
])
def test_a_body_that_is_not_a_json_object_says_what_is_wrong(served, content, headers, message) -> None:
    client = served()
    r = client.post("/v1/completions", content=content, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": message, "type": "invalid_request_error", "param": None, "code": 400}


@pytest.mark.parametrize("value", ["1e400", "Infinity", "NaN", "1e308"])  # 1e308 'must be finite'; it is
def test_a_temperature_that_is_not_finite_is_a_400(served, value) -> None:
    """JSON's 1e400 (and Python's Infinity) parse as inf, which the sampler took: logits / inf are a uniform draw."""
    client = served()
    r = client.post("/v1/completions", content=f'{{"prompt": [1], "temperature": {value}}}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "temperature"
    assert r.json()["error"]["message"] == f"temperature must be a number from 0 to 3.4e+38, got {float(value)}"


class CountingTokenizer(CharTokenizer):
    def __init__(self) -> None:
        self.num_encodes = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.num_encodes += 1
        return super().encode(text, add_special_tokens)


def test_too_many_prompts_are_refused_before_any_is_tokenized(served) -> None:
    """Every prompt was tokenized, in the event loop, before the count was checked: 100,000 of them held the server
    (and /health) for seconds, then got the 400 anyway."""
    tokenizer = CountingTokenizer()
    client = served(tokenizer=tokenizer)
    settled = tokenizer.num_encodes  # build_app's one encode
    r = client.post("/v1/completions", json={"prompt": ["ab"] * 600, "n": 2, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert r.json()["error"]["message"] == ("the request asks for 1200 sequences (600 prompts x n=2); the server "
                                            "queues at most 1000 (--max-waiting-requests)")
    assert tokenizer.num_encodes == settled


def test_one_prompt_with_too_many_samples_is_named_in_the_singular(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": "ab", "n": 1001, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert r.json()["error"]["message"] == ("the request asks for 1001 sequences (1 prompt x n=1001); the server "
                                            "queues at most 1000 (--max-waiting-requests)")


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"tool_choice": "required"}, "tool_choice",
     "tool_choice required is not supported by this engine (no tool calls); leave it out, or 'none' or 'auto'"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     "tool_choice {'type': 'function', 'function': {'name': 'f'}} is not supported by this engine (no tool calls); "
     "leave it out, or 'none' or 'auto'"),
    ({"functions": [{"name": "f"}]}, "functions", "functions are not supported by this engine"),
    ({"function_call": {"name": "f"}}, "function_call",
     "function_call {'name': 'f'} is not supported by this engine (no tool calls); leave it out, or 'none' or 'auto'"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages",
     "a message content part of type 'text' needs a string 'text', got None"),
    # vLLM's chat extensions that change the output were ignored: the reply answered instead of continuing the
    # assistant's message, or left out the echo the client asked for
    ({"continue_final_message": True}, "continue_final_message",
     "continue_final_message is not supported by this engine (got True)"),
    ({"echo": True}, "echo", "echo is not supported by this engine (got True)"),
])
def test_chat_asks_the_engine_cannot_answer_are_refused(served, fields, param, message) -> None:
    """A required tool call or function was ignored (the client got text instead), and a text part without its text
    said "must be of type 'text', got 'text'"."""
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 1,
                                                  **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == param


def test_chat_tool_choice_none_or_auto_without_tools_is_served(served) -> None:
    client = served(tokenizer=CharTokenizer())
    for choice in ("none", "auto"):
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}],
                                                      "max_tokens": 1, "tool_choice": choice, "tools": []})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("kwargs", [{"tokenize": True}, {"conversation": []}, {"tools": [{"type": "function"}]}])
def test_chat_template_kwargs_may_not_set_apply_chat_templates_own_arguments(served, kwargs) -> None:
    """They were a 400 quoting Python ("apply_chat_template() got multiple values for keyword argument 'tokenize'"),
    or reached the template (tools) when tools are refused."""
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 1,
                                                  "chat_template_kwargs": kwargs})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": f"chat_template_kwargs may not set {next(iter(kwargs))}: they are not "
                                            "template variables", "type": "invalid_request_error",
                                 "param": "chat_template_kwargs", "code": 400}


BODY_LIMIT_BYTES = 1000


def body_limit_error(size: str) -> dict:
    return {"error": {"message": f"the request body has {size} bytes; this server accepts at most {BODY_LIMIT_BYTES} "
                                 "(--max-request-body-bytes)",
                      "type": "invalid_request_error", "param": None, "code": 413}}


def test_a_body_over_the_limit_is_a_413_whether_its_length_is_declared_or_streamed(served) -> None:
    """FastAPI read and parsed any body whole, in the event loop: 200,000 chat messages held /health for 1.8 s,
    and a multi-GB body went into memory."""
    client = served(max_request_body_bytes=BODY_LIMIT_BYTES)
    within = json.dumps({"prompt": [1] * 200, "max_tokens": 1}).encode()
    assert len(within) < BODY_LIMIT_BYTES
    r = client.post("/v1/completions", content=within, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 200
    over = json.dumps({"prompt": [1] * 400, "max_tokens": 1}).encode()
    r = client.post("/v1/completions", content=over, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json() == body_limit_error(str(len(over)))
    assert r.headers["connection"] == "close"
    # chunked: no length declared, so it is counted as it arrives
    r = client.post("/v1/chat/completions", content=iter([over[:600], over[600:]]),
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json() == body_limit_error(f"more than {BODY_LIMIT_BYTES}")
    assert client.get("/health").status_code == 200


@contextlib.contextmanager
def _loopback_server(app):
    """``app`` under uvicorn on a free loopback port, in a thread; yields the port."""
    import socket
    import threading

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _answer(conn) -> tuple[bytes, dict]:
    """The status line and JSON body of the response on ``conn`` (read until the server closes it)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)


def test_the_limit_is_enforced_over_http_before_the_body_is_read() -> None:
    """Over a real connection: a 10 GB Content-Length is answered at once, with no byte of its body sent, and a
    chunked body once it passes the limit, before its last chunk; the server closes those connections."""
    import socket

    engine = EngineClient(functools.partial(scripted_llm, ScriptedRunner, {}, {}), model_name="m",
                          max_waiting_requests=10)
    engine.start(timeout_s=60)
    try:
        with _loopback_server(build_app(engine, max_request_body_bytes=BODY_LIMIT_BYTES)) as port:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 10000000000\r\n\r\n")
                status, body = _answer(conn)
            assert status == b"HTTP/1.1 413 Request Entity Too Large" and body == body_limit_error("10000000000")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: chunked\r\n\r\n")
                for _ in range(3):  # 1,200 bytes, and no terminating chunk
                    conn.sendall(b"190\r\n" + b" " * 400 + b"\r\n")
                status, body = _answer(conn)
            assert status == b"HTTP/1.1 413 Request Entity Too Large"
            assert body == body_limit_error(f"more than {BODY_LIMIT_BYTES}")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:  # the server goes on serving
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert conn.recv(65536).startswith(b"HTTP/1.1 200 OK")
    finally:
        engine.stop()  # the app's shutdown stopped it already, unless the server never started


def test_a_completion_without_max_tokens_is_told_the_16_it_asks_for_is_the_default(served) -> None:
    """A completion leaves max_tokens out: it asks for OpenAI's default 16, and the refusal named max_tokens=16 as
    if the client had sent it."""
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/completions", json={"prompt": [1] * 250})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {**r.json()["error"], "param": "max_tokens", "message": (
        "this model's maximum context length is 256 tokens; the request asks for 266 (250 in the prompt, "
        "max_tokens=16 to generate, the default: the request does not set it)")}
    r = client.post("/v1/completions", json={"prompt": [1] * 250, "max_tokens": 16})  # sent: said as it was
    assert r.json()["error"]["message"].endswith("max_tokens=16 to generate)")
