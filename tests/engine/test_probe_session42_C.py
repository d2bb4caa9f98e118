"""The OpenAI server as a client coming from vLLM uses it: /v1/completions takes max_completion_tokens (OpenAI's newer
name for max_tokens; it was ignored there, and the client got the default 16 tokens), and every choice says in
vLLM's stop_reason which stop string or stop_token_ids token ended it (the text leaves a stop string out, so a
client that gave several could not tell which one matched). /metrics has vLLM's request phase histograms, which its
Grafana dashboard reads."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from engine.core.detokenizer import IncrementalDetokenizer  # noqa: E402
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import CharTokenizer, sse_events, wait_until_idle  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient

# The scripted runner continues a prompt with the next tokens of the alphabet: prompt "a" gets "bcdefgh...".


def test_a_completion_takes_max_completion_tokens_over_max_tokens_as_a_chat_does(served) -> None:
    client = served(tokenizer=CharTokenizer())
    for body, text in (({"max_completion_tokens": 3}, "bcd"), ({"max_completion_tokens": 2, "max_tokens": 5}, "bc"),
                       ({"max_completion_tokens": None, "max_tokens": 4}, "bcde")):
        r = client.post("/v1/completions", json={"prompt": "a", **body})
        choice = r.json()["choices"][0]
        assert (choice["text"], choice["finish_reason"], r.json()["usage"]["completion_tokens"]) == (
            text, "length", len(text))


@pytest.mark.parametrize(("value", "message"), [
    (0, "max_completion_tokens must be >= 1, got 0"),
    (1000, "this model's maximum context length is 256 tokens; the request asks for 1001 (1 in the prompt, "
           "max_completion_tokens=1000 to generate)"),
])
def test_a_completions_max_completion_tokens_is_checked_and_named(served, value, message) -> None:
    client = served(tokenizer=CharTokenizer())
    r = client.post("/v1/completions", json={"prompt": "a", "max_completion_tokens": value, "max_tokens": 5})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_completion_tokens"
    assert r.json()["error"]["message"] == message


@pytest.mark.parametrize(("ask", "text", "stop_reason"), [
    ({"stop": ["zz", "cd", "bcd"]}, "", "bcd"),  # both complete with the "d": the earlier in the text ends it
    ({"stop": "ef"}, "bcd", "ef"),
    ({"stop_token_ids": [7, 4]}, "bcd", 4),  # the token's text is left out, its id said
    ({"stop_token_ids": [30]}, "bcdefg", None),  # cut by max_tokens: nothing stopped it
])
def test_each_choice_says_what_stopped_it_as_vllms_stop_reason(served, ask, text, stop_reason) -> None:
    client = served(tokenizer=CharTokenizer())
    body = {"prompt": "a", "max_tokens": 6, **ask}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]
    assert (whole["text"], whole["finish_reason"], whole["stop_reason"]) == (
        text, "length" if stop_reason is None else "stop", stop_reason)
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        chunks = [e["choices"][0] for e in sse_events(r)[:-1]]
    assert "".join(c["text"] for c in chunks) == text
    assert [c.get("stop_reason", "absent") for c in chunks] == ["absent"] * (len(chunks) - 1) + [stop_reason]


def test_a_chats_choices_say_what_stopped_them_streamed_or_not(served) -> None:
    client = served(tokenizer=CharTokenizer())
    body = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "m"}], "n": 2,
            "max_tokens": 6, "stop": ["pq", "ef"]}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"]
    assert [(c["message"]["content"], c["stop_reason"]) for c in whole] == [("no", "pq")] * 2
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        events = sse_events(r)[:-1]
    last = [e["choices"][0] for e in events if e["choices"][0]["finish_reason"] is not None]
    assert sorted((c["index"], c["finish_reason"], c["stop_reason"]) for c in last) == [
        (0, "stop", "pq"), (1, "stop", "pq")]
    assert sum("stop_reason" in e["choices"][0] for e in events) == 2  # the role and text chunks carry none


class WordTokenizer:
    """Token i is the word WORDS[i]."""

    WORDS = ("x", "ycde", "z")

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.WORDS[i] for i in ids)


def test_of_stop_strings_at_one_place_the_first_listed_is_the_stop_reason() -> None:
    detokenizer = IncrementalDetokenizer(WordTokenizer(), ["de", "cde", "cd"])
    assert detokenizer.add([0]) == ""  # held back: the last two characters could begin a stop string
    assert detokenizer.add([1]) == "xy"
    assert (detokenizer.stopped, detokenizer.stop_string) == (True, "cde")


def test_metrics_split_a_request_into_vllms_phases(served) -> None:
    """vLLM's request_prefill_time_seconds and request_decode_time_seconds (a panel of its Grafana dashboard) and
    request_inference_time_seconds: first scheduled to first token, first token to last, first scheduled to last."""
    client = served(runner_kwargs={"step_s": 0.02})
    client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4, "n": 2})
    m = wait_until_idle(client)
    for phase in ("prefill", "decode", "inference"):
        assert m[f"vllm:request_{phase}_time_seconds_count"] == 2
    prefill, decode = m["vllm:request_prefill_time_seconds_sum"], m["vllm:request_decode_time_seconds_sum"]
    assert decode >= 2 * 3 * 0.02  # three steps after each choice's first token, of 20 ms or more
    assert prefill + decode == pytest.approx(m["vllm:request_inference_time_seconds_sum"], abs=1e-9)
    assert m["vllm:request_queue_time_seconds_sum"] + m["vllm:request_inference_time_seconds_sum"] == pytest.approx(
        m["vllm:e2e_request_latency_seconds_sum"], abs=1e-9)
