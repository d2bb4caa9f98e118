"""Probe F of session 30: the OpenAI server with unusual requests, against what vLLM's answers; each test failed before
its fix.

- A chat message whose content is a list of text parts (``[{"type": "text", "text": "ab"}, {"type": "text", "text":
  "cd"}]``, as the openai client and LangChain send it) reached the template as "abcd": vLLM (and SGLang, TensorRT-LLM)
  join the parts with a newline, "ab\\ncd". Another prompt than vLLM's, without a word.
- ``X-Request-Id`` (a gateway's or a client's id for the request) was ignored: vLLM names its response by it
  (``cmpl-<id>``, ``chatcmpl-<id>``), and takes vLLM's ``request_id`` field where no header is sent; the answer here had
  a random id, so a client's logs and the server's response could not be matched. Now as vLLM, and the header comes
  back on the response (vLLM's --enable-request-id-headers); an id of more than 512 characters is a 400 naming it.

Probed and held as vLLM's (no change): tool, developer and system-only messages, name fields, null content; stop as a
string, a list, 5 strings, [] (none), "" (400); stop strings spanning byte-level BPE tokens, streamed and not (60 cuts
of the tiny Qwen3's text: the same text, no stop string leaked, finish_reason "stop" once); n with best_of (equal: 200,
other: 400); seed with n (reproducible, choice 0 equal to n=1, streamed equal to whole); include_usage with n > 1 (one
usage chunk, the prompt counted once); max_completion_tokens over max_tokens; logprobs/top_logprobs/echo/suffix/
logit_bias/response_format refused by name; non-UTF-8 bodies, arrays, Content-Type not JSON, duplicate keys; HTTP/1.0
clients (a body without Content-Length is empty, as HTTP/1.0 has it); pipelined requests; 30 concurrent streams with a
third of their clients leaving, /metrics read meanwhile: every stream finished, nothing left running, the KV cache back
to 0 %, nothing in the log.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import CharTokenizer, sse_events  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient


def _prompt_ids(client, content) -> list[int]:
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], "max_tokens": 1,
                                                   "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["prompt_token_ids"]


def test_text_parts_of_a_message_are_joined_with_newlines_as_in_vllm(served) -> None:
    client = served(tokenizer=CharTokenizer())
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
    assert _prompt_ids(client, parts) == _prompt_ids(client, "ab\ncd") != _prompt_ids(client, "abcd")
    assert _prompt_ids(client, parts[:1]) == _prompt_ids(client, "ab")  # one part is its text


@pytest.mark.parametrize("path, body, prefix", [
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 2}, "cmpl-"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 2}, "chatcmpl-"),
])
def test_x_request_id_names_the_response_and_comes_back_as_in_vllm(served, path, body, prefix) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post(path, json=body, headers={"X-Request-Id": "trace-42"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == f"{prefix}trace-42" and r.headers["x-request-id"] == "trace-42"
    with client.stream("POST", path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                       headers={"X-Request-Id": "trace-43"}) as r:
        assert r.headers["x-request-id"] == "trace-43"
        events = sse_events(r)
    assert events[-1] == "[DONE]" and {e["id"] for e in events[:-1]} == {f"{prefix}trace-43"}
    # vLLM's request_id field, where no header is sent; the header wins over it
    assert client.post(path, json={**body, "request_id": "r-1"}).json()["id"] == f"{prefix}r-1"
    r = client.post(path, json={**body, "request_id": "r-1"}, headers={"X-Request-Id": "h-1"})
    assert r.json()["id"] == f"{prefix}h-1"
    r = client.post(path, json=body)  # none given: a random one, and no header
    assert r.json()["id"].startswith(prefix) and len(r.json()["id"]) == len(prefix) + 32
    assert "x-request-id" not in r.headers


def test_a_request_id_too_long_or_not_a_string_is_a_400_naming_it(served) -> None:
    client = served(tokenizer=CharTokenizer())
    body = {"prompt": [1, 2], "max_tokens": 2}
    r = client.post("/v1/completions", json=body, headers={"X-Request-Id": "x" * 513})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id"
    assert r.json()["error"]["message"] == ("the X-Request-Id header has 513 characters; at most 512 are taken (every "
                                            "chunk of a stream repeats it)")
    r = client.post("/v1/completions", json={**body, "request_id": "x" * 600})
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_id", r.text
    r = client.post("/v1/completions", content=b'{"prompt": [1], "request_id": "\\ud800"}',
                    headers={"content-type": "application/json"})  # half a surrogate pair: it was a 500 encoding it
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_id", r.text
    assert "unpaired surrogate (U+D800)" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={**body, "request_id": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "request_id", r.text
    assert client.post("/v1/completions", json=body, headers={"X-Request-Id": "x" * 512}).status_code == 200
