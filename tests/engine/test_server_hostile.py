"""Hostile and unusual requests to the HTTP server, as an outside evaluator sends them: each once got a 500, a silently
different answer, a misleading message, a lost answer or a long stall. Most run on the scripted engine of
test_server_api (no torch); the last drives ``python -m engine.serve`` on the tiny random Qwen3 of test_server_openai
over a loopback port and checks, after every hostile request, that a normal one still gets its greedy tokens and that
no KV block stays in use."""

from __future__ import annotations

import functools
import gzip
import json
import socket
import time
import warnings
import zlib

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import (  # noqa: E402
    CharTokenizer,
    ScriptedRunner,
    _loopback_server,
    expected_tokens,
    scripted_llm,
    sse_events,
)

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient

BOS = 98


class RecordingTokenizer(CharTokenizer):
    """CharTokenizer that adds a BOS when asked to (as Hugging Face's do by default), and records what it was given:
    the texts it encoded, and the messages the chat template rendered."""

    def __init__(self) -> None:
        self.encoded: list[tuple[str, bool]] = []
        self.rendered: list[list[dict]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded.append((text, add_special_tokens))
        return ([BOS] if add_special_tokens else []) + super().encode(text)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs) -> str:
        self.rendered.append(messages)
        return super().apply_chat_template(messages, tokenize, add_generation_prompt, **kwargs)


def byte_level_tokenizer():
    """A real Hugging Face byte-level BPE tokenizer (trained here, offline), as Qwen's and Llama 3's are: one whose
    longest token bounds how many characters max_model_len tokens can spell."""
    pytest.importorskip("transformers")
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world " * 20, "the quick brown fox"] * 10, vocab_size=300, show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tokenizer


def _normal_request_works(client) -> None:
    r = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == expected_tokens([5, 6], 3)


# ---- an unpaired surrogate quoted back in an error ------------------------------------------------------------------
@pytest.mark.parametrize(("path", "fields", "status", "param"), [
    ("/v1/completions", {"model": "\ud800"}, 404, "model"),
    ("/v1/completions", {"min_p": "\ud800"}, 400, "min_p"),
    ("/v1/chat/completions", {"tool_choice": "\ud800"}, 400, "tool_choice"),
])
def test_a_surrogate_quoted_in_an_error_is_the_clients_error_not_a_500(served, path, fields, status, param) -> None:
    """JSON may escape half a surrogate pair; an error that quoted it failed to encode, and the client got a 500
    ('surrogates not allowed') instead of the error about its request."""
    client = served(tokenizer=CharTokenizer())
    base = {"prompt": [1]} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "ab"}]}
    r = client.post(path, content=json.dumps({**base, "max_tokens": 2, **fields}),  # json.dumps escapes it: \\ud800
                    headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\\ud800" in error["message"]
    _normal_request_works(client)


@pytest.mark.parametrize(("content", "message"), [
    # was "the request body is not read as JSON: send it with Content-Type: application/json", for both
    (b'{"prompt": [1], "\\ud800": 1}', "the request body has a field name that is not Unicode text: '\\ud800'"),
    (b'"a string"', "the request body must be a JSON object, got a string"),
])
def test_a_body_fastapi_parsed_is_not_said_to_be_unread(served, content, message) -> None:
    client = served()
    r = client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message


# ---- null, as OpenAI's clients send for "not set" -------------------------------------------------------------------
def test_null_stands_for_the_default_of_a_field_that_cannot_be_null(served) -> None:
    """OpenAI's API marks n, stream, echo, ... nullable; a null was "Input should be a valid integer"."""
    client = served(tokenizer=CharTokenizer())
    nulls = {"n": None, "stream": None, "echo": None, "ignore_eos": None, "return_token_ids": None, "min_tokens": None}
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, **nulls})
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == ["def"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 2,
                                                  "logprobs": None, "add_generation_prompt": None, **nulls})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "cd"
    with client.stream("POST", "/v1/completions", json={"prompt": "abc", "max_tokens": 2, "stream": True,
                                                        "stream_options": {"include_usage": None}}) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])  # include_usage's default: none
    # a field that does take null keeps its meaning: max_tokens null is the room the prompt leaves
    r = client.post("/v1/completions", json={"prompt": [5], "max_tokens": None, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 255


# ---- what changes the answer is honoured or refused, never ignored --------------------------------------------------
def test_chat_messages_reach_the_template_with_their_other_fields(served) -> None:
    """name, tool_calls and tool_call_id were dropped before the template: an agent's earlier tool calls and their
    results vanished from its prompt (vLLM hands them on)."""
    tokenizer = RecordingTokenizer()
    client = served(tokenizer=tokenizer)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "ab", "name": "bob"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "cd", "tool_call_id": "c1"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert tokenizer.rendered[-1] == [{"role": "user", "content": "ab", "name": "bob"},
                                      {"role": "assistant", "content": "", "tool_calls": [call]},
                                      {"role": "tool", "content": "cd", "tool_call_id": "c1"}]


@pytest.mark.parametrize(("path", "fields", "param"), [
    ("/v1/chat/completions", {"best_of": 3}, "best_of"),  # vLLM's chat took it; here it was ignored
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),  # vLLM's: JSON output
    ("/v1/completions", {"priority": -5}, "priority"),  # vLLM's priority scheduling: served first-come, silently
    ("/v1/chat/completions", {"priority": 1}, "priority"),
])
def test_what_would_change_the_answer_is_refused_not_ignored(served, path, fields, param) -> None:
    client = served(tokenizer=CharTokenizer())
    base = {"prompt": "ab"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "ab"}]}
    r = client.post(path, json={**base, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    r = client.post(path, json={**base, "max_tokens": 2, **{k: None for k in fields}})  # left at nothing: served
    assert r.status_code == 200, r.text


def test_add_special_tokens_is_honoured(served) -> None:
    """vLLM's add_special_tokens (a completion's text gets the tokenizer's BOS unless false; a chat's rendered template
    gets none unless true) was ignored: a client leaving out the BOS still had it."""
    client = served(tokenizer=RecordingTokenizer())

    def prompt_tokens(path: str, **fields) -> int:
        base = {"prompt": "abc"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "abc"}]}
        r = client.post(path, json={**base, "max_tokens": 1, **fields})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens("/v1/completions") == 4
    assert prompt_tokens("/v1/completions", add_special_tokens=False) == 3
    assert prompt_tokens("/v1/chat/completions") == 3
    assert prompt_tokens("/v1/chat/completions", add_special_tokens=True) == 4


# ---- a prompt far beyond max_model_len ------------------------------------------------------------------------------
def test_a_text_far_beyond_max_model_len_is_refused_before_it_is_tokenized(served) -> None:
    """A 15 MB prompt to a model of 512 tokens was tokenized first: 40 s and 5 GB of memory that the server kept, to
    say it had 12 million tokens. Its longest token says how many characters max_model_len tokens can spell."""
    tokenizer = byte_level_tokenizer()
    longest = max(len(t) for t in tokenizer.get_vocab())
    client = served(tokenizer=tokenizer)
    limit = 256 * longest * 2  # max_model_len 256, with the margin for normalizers that merge characters
    calls = []
    encode = tokenizer.encode
    tokenizer.encode = lambda text, **kw: calls.append(len(text)) or encode(text, **kw)
    for path, body in (("/v1/completions", {"prompt": ["hello", "x" * (limit + 1)]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (limit + 1)}]})):
        r = client.post(path, json={**body, "max_tokens": 1})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "cannot fit in max_model_len=256 tokens" in error["message"]
        assert error["param"] == ("prompt" if path == "/v1/completions" else "messages")
        assert calls == []  # not even the short prompt beside it
    r = client.post("/v1/completions", json={"prompt": "x" * limit, "max_tokens": 1})  # within the bound: tokenized
    assert calls == [limit] and r.status_code == 400  # (then refused for its tokens)
    assert "untokenized" not in r.json()["error"]["message"]


def test_no_bound_is_taken_from_a_tokenizer_that_may_drop_or_lump_text(served) -> None:
    """A word-level tokenizer turns any run of unknown text into one token: its longest token bounds nothing."""
    from tests.engine.test_server_api import hf_tokenizer

    client = served(tokenizer=hf_tokenizer())
    r = client.post("/v1/completions", json={"prompt": "x" * 5000, "max_tokens": 1, "return_token_ids": True})
    assert r.status_code == 200, r.text  # one [UNK]
    assert r.json()["usage"]["prompt_tokens"] == 1


# ---- routes ---------------------------------------------------------------------------------------------------------
def test_an_unknown_route_says_what_is_served_and_the_docs_raise_no_warning(served) -> None:
    client = served()
    r = client.post("/v1/embeddings", json={"input": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["message"].startswith("there is no /v1/embeddings on this server; it serves "
                                                   "/v1/completions, /v1/chat/completions")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert client.get("/openapi.json").status_code == 200
    assert not [w for w in caught if "Duplicate Operation ID" in str(w.message)]  # was in the server's log
    assert client.head("/health").status_code == 200 and client.get("/health").status_code == 200


# ---- a refused body over a real connection --------------------------------------------------------------------------
LIMIT_BYTES = 1000


@pytest.fixture
def loopback_port():
    from engine.server.api import build_app
    from engine.server.engine_client import EngineClient

    engine = EngineClient(functools.partial(scripted_llm, ScriptedRunner, {}, {}), model_name="m",
                          max_waiting_requests=10)
    engine.start(timeout_s=60)
    try:
        with _loopback_server(build_app(engine, max_request_body_bytes=LIMIT_BYTES)) as port:
            yield port
    finally:
        engine.stop()


def _read_all(conn: socket.socket) -> bytes:
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def test_a_client_that_sends_its_whole_body_before_reading_gets_the_413(loopback_port) -> None:
    """httpx (and so the openai SDK) writes the whole request before reading: the server answered at once and closed
    with the body still arriving, the connection was reset, and the client saw "peer closed connection" (or a broken
    pipe) instead of the 413."""
    size = 32 * 2**20  # more than the kernel's socket buffers hold: the sender must wait for the server to read
    with socket.create_connection(("127.0.0.1", loopback_port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % size)
        conn.sendall(b" " * size)  # was ConnectionResetError / BrokenPipeError
        data = _read_all(conn)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["message"] == (f"the request body has {size} bytes; this server accepts at most "
                                                    f"{LIMIT_BYTES} (--max-request-body-bytes)")


def test_a_client_that_waits_for_100_continue_is_answered_at_once(loopback_port) -> None:
    """It sends nothing before the server says to go on: reading its body would tell it to."""
    with socket.create_connection(("127.0.0.1", loopback_port), timeout=30) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Expect: 100-continue\r\nContent-Length: 5000000\r\n\r\n")
        data = _read_all(conn)
    assert data.startswith(b"HTTP/1.1 413")  # not "HTTP/1.1 100 Continue" first


# ---- the real server, and a normal request after each hostile one ---------------------------------------------------
HOSTILE = [  # (path, body or raw bytes, expected status)
    ("/v1/completions", b"{not json", 400),
    ("/v1/completions", b'{"prompt": "a", "model": "\\ud800"}', 404),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": "5"}, 400),
    ("/v1/completions", {"prompt": [1, 2], "temperature": [1]}, 400),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": 10**30}, 400),
    ("/v1/completions", {"prompt": "w1x7 " * 200_000, "max_tokens": 1}, 400),  # 1 MB of text, refused untokenized
    ("/v1/completions", {"prompt": [1, -2]}, 400),
    ("/v1/completions", {"prompt": [1, 512]}, 400),
    ("/v1/completions", {"prompt": [1], "n": None, "stream": None, "max_tokens": 2}, 200),
    ("/v1/completions", {"prompt": [1], "best_of": 2, "max_tokens": 2}, 400),
    ("/v1/completions", {"prompt": [1], "top_p": 0}, 400),
    ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                              "max_tokens": 2, "best_of": 1}, 200),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w1x7 " * 200_000}]}, 400),
]


def test_the_real_server_survives_hostile_requests(tmp_path_factory) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    httpx = pytest.importorskip("httpx")
    from engine.server import launch
    from tests.engine.test_server_openai import make_tiny_model_with_tokenizer, metrics, start_server

    model_dir = make_tiny_model_with_tokenizer(tmp_path_factory.mktemp("tiny-hostile"))
    proc, url = start_server(["--model", model_dir, "--device", "cpu", "--warmup-requests", "0"])
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            def normal() -> list[int]:
                r = http.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0,
                                                       "return_token_ids": True})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["token_ids"]

            baseline = normal()
            for path, body, status in HOSTILE:
                start = time.monotonic()
                if isinstance(body, bytes):
                    r = http.post(path, content=body, headers={"content-type": "application/json"})
                else:
                    r = http.post(path, json=body)
                assert r.status_code == status, (path, str(body)[:80], r.text)
                assert time.monotonic() - start < 10, (path, str(body)[:80])
                if status != 200:
                    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
                assert normal() == baseline
                assert metrics(url)["vllm:kv_cache_usage_perc"] == 0
    finally:
        launch.stop_server(proc)


@pytest.mark.parametrize("encoding, content", [
    ("gzip", gzip.compress(b'{"prompt": [1, 2], "max_tokens": 2}')),  # not UTF-8: "could not be parsed as JSON"
    ("deflate", zlib.compress(b'{"prompt": [1, 2], "max_tokens": 2}')),
    ("br", b"\x0b\x80" + b"{}" * 4),  # UTF-8, not JSON: "the request body is not valid JSON"
])
def test_a_compressed_body_is_a_415_that_says_to_send_it_uncompressed(served, encoding, content) -> None:
    """Nothing decodes a compressed request body: it was a 400 saying it was "not UTF-8 text (byte 8b at 1)"."""
    client = served()
    r = client.post("/v1/completions", content=content,
                    headers={"content-type": "application/json", "content-encoding": encoding})
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert f"Content-Encoding: {encoding}" in error["message"] and "uncompressed" in error["message"]
    # a body that was read as JSON is judged by its fields, whatever its header says
    r = client.post("/v1/completions", content=b'{"prompt": [1, 2], "max_tokens": "2"}',
                    headers={"content-type": "application/json", "content-encoding": encoding})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    _normal_request_works(client)


def test_a_405_lists_every_method_the_path_serves(served) -> None:
    """GET and HEAD of /health are two routes; Starlette's 405 named the first only: POST /health was told "use
    HEAD" (Allow: HEAD), which answers no body, though GET is served there too."""
    client = served()
    r = client.post("/health")
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "GET, HEAD"
    assert r.json()["error"]["message"] == "POST is not allowed on /health; use GET, HEAD"
    r = client.delete("/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
