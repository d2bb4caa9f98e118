"""min_tokens through the server, on completions and chat as vLLM takes it: the first that many tokens never stop a
choice, by a stop token (the scheduler's rule: the scripted runner here masks no logits) or a stop string (the
detokenizer's: one that ends inside their text does not count)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import CharTokenizer  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient

# The scripted runner continues a prompt with the next tokens of the alphabet: prompt "a" gets "bcdefgh...", token
# ids 1, 2, 3, ...


@pytest.mark.parametrize(("body", "text", "finish_reason", "stop_reason"), [
    ({"stop_token_ids": [3], "min_tokens": 2}, "bc", "stop", 3),  # "d" is the third token: it may stop
    ({"stop_token_ids": [3], "min_tokens": 3}, "bcdefghijk", "length", None),
    ({"stop": ["cd"], "min_tokens": 2}, "b", "stop", "cd"),  # ends with the third token's text
    ({"stop": ["cd"], "min_tokens": 3}, "bcdefghijk", "length", None),  # ends inside the first three's
    ({"stop": ["c"], "min_tokens": 0}, "b", "stop", "c"),
])
def test_completions_and_chat_take_min_tokens(served, body, text, finish_reason, stop_reason) -> None:
    client = served(tokenizer=CharTokenizer())
    for path, request, answer in (("/v1/completions", {"prompt": "a"}, lambda c: c["text"]),
                                  ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]},
                                   lambda c: c["message"]["content"])):
        r = client.post(path, json={**request, "max_tokens": 10, **body})
        choice = r.json()["choices"][0]
        assert (answer(choice), choice["finish_reason"], choice["stop_reason"]) == (text, finish_reason, stop_reason)


@pytest.mark.parametrize(("body", "message"), [
    ({"min_tokens": -1}, "min_tokens must be an int from 0 to max_tokens (5), got -1"),
    ({"min_tokens": 6}, "min_tokens must be an int from 0 to max_tokens (5), got 6"),
])
def test_a_min_tokens_outside_0_to_max_tokens_is_refused_by_name(served, body, message) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 5,
                                                  **body})
    assert r.status_code == 400
    assert (r.json()["error"]["param"], r.json()["error"]["message"]) == ("min_tokens", message)
