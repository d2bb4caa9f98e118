"""Probe R of session 27: the OpenAI server against what vLLM's answers; each test failed before its fix.

- ``return_token_ids`` (vLLM's extension) gave the completion's ids only: vLLM's answer holds the prompt's too
  (``prompt_token_ids``: on each completion choice, on a chat response; a stream's first chunk), and a chat client
  cannot rebuild them without the server's template. A client that asked for them got none, without a word.
- ``seed: -1`` is vLLM's "no seed" (its SamplingParams takes -1 as None), what clients send for a random draw: a 400.
- ``model: ""`` is vLLM's served model (it checks a model name only when one is given): a 404.
- ``top_logprobs`` without ``logprobs`` was refused naming ``logprobs``, a field the client had not sent.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.server.api import _sampling_params  # noqa: E402
from engine.server.protocol import CompletionRequest  # noqa: E402
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import CharTokenizer, sse_events  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient
CHAT = {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 2}


def test_return_token_ids_returns_the_prompt_token_ids_as_vllm_does(served) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/completions", json={"prompt": [[1, 2], [40, 41, 42]], "n": 2, "max_tokens": 2,
                                             "return_token_ids": True})
    assert [(c["prompt_token_ids"], c["token_ids"]) for c in r.json()["choices"]] == [
        ([1, 2], [3, 4]), ([1, 2], [3, 4]), ([40, 41, 42], [43, 44]), ([40, 41, 42], [43, 44])]
    r = client.post("/v1/chat/completions", json={**CHAT, "return_token_ids": True})
    assert r.json()["prompt_token_ids"] == [0, 1] and r.json()["choices"][0]["token_ids"] == [2, 3]
    # Not asked for: not there.
    assert "prompt_token_ids" not in client.post("/v1/completions", json={"prompt": [1], "max_tokens": 1}).json()[
        "choices"][0]
    assert "prompt_token_ids" not in client.post("/v1/chat/completions", json=CHAT).json()


def test_a_stream_sends_the_prompt_token_ids_in_its_first_chunk(served) -> None:
    client = served(tokenizer=CharTokenizer())
    with client.stream("POST", "/v1/completions", json={"prompt": [[1, 2], [40]], "max_tokens": 3, "stream": True,
                                                        "return_token_ids": True}) as r:
        chunks = sse_events(r)[:-1]
    for index, prompt in ((0, [1, 2]), (1, [40])):
        own = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert [c.get("prompt_token_ids") for c in own] == [prompt, None, None]
        assert sum((c["token_ids"] for c in own), []) == [prompt[-1] + 1, prompt[-1] + 2, prompt[-1] + 3]
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "n": 2, "stream": True,
                                                             "return_token_ids": True}) as r:
        chunks = sse_events(r)[:-1]
    assert [c.get("prompt_token_ids") for c in chunks[:2]] == [[0, 1], [0, 1]]  # each choice's role chunk
    assert all("prompt_token_ids" not in c for c in chunks[2:])


def test_seed_minus_one_is_no_seed_as_in_vllm(served) -> None:
    client = served()
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2, "seed": -1, "n": 2})
    assert r.status_code == 200, r.text
    state = client.app.state.server
    for copy in (0, 1):  # not 2**64 - 1 and its copies' 0, 1, ...: each copy draws at random
        params = _sampling_params(state, CompletionRequest(prompt=[1], seed=-1), 1, 2, copy, stop_token_ids=frozenset())
        assert params.seed is None
    assert SamplingParams(seed=-1).seed is None  # engine.LLM's too, as vLLM's
    r = client.post("/v1/completions", json={"prompt": [1], "max_tokens": 2, "seed": -2})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "seed must be -1 (no seed) or an integer in [0, 2**64), got -2"


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": [1], "max_tokens": 1}),
                                        ("/v1/chat/completions", CHAT)])
def test_an_empty_model_name_asks_for_the_served_model_as_in_vllm(served, path, body) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post(path, json={**body, "model": ""})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m"
    assert client.post(path, json={**body, "model": "other"}).status_code == 404


@pytest.mark.parametrize("fields, param", [
    ({"top_logprobs": 2}, "top_logprobs"), ({"top_logprobs": -1}, "top_logprobs"), ({"logprobs": True}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs")])
def test_a_refused_top_logprobs_is_named(served, fields, param) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={**CHAT, **fields})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["message"].startswith(f"{param} is not supported by this engine")
