"""Probe session 22 (G): the OpenAI server as a hostile evaluator drives it; each test failed before its fix."""

from __future__ import annotations

import dataclasses
import time
from array import array

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from engine.server.engine_process import StepStats, Timing, Update  # noqa: E402
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import CharTokenizer, wait_until_idle  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient


def _metrics_once(client, name: str, value: float, timeout_s: float = 5.0) -> dict[str, float]:
    """The metrics once ``name`` reached ``value`` (an abort's acknowledgement lands after the response)."""
    deadline = time.time() + timeout_s
    while True:
        m = wait_until_idle(client)
        if m.get(name) == value or time.time() > deadline:
            return m
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_choice_a_stop_string_ended_is_in_the_request_metrics(served, stream) -> None:
    """A stop string ends a choice in the server (the engine's sequence is aborted): it was counted in
    request_success{stop} and nowhere else. Its prompt tokens, its latencies and its length were missing from
    vllm:prompt_tokens_total and every request histogram, so a workload whose answers end at a stop string showed
    no TTFT, no e2e latency and no prompt throughput at all. vLLM checks stop strings itself and counts such a
    request as any finished one."""
    client = served(tokenizer=CharTokenizer(), runner_kwargs={"step_s": 0.05})
    body = {"prompt": "abc", "max_tokens": 40, "ignore_eos": True, "stop": ["g"], "stream": stream}
    for _ in range(2):
        if stream:
            with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                text = "".join(line for line in r.iter_lines())
            assert '"finish_reason":"stop"' in text
        else:
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert (choice["text"], choice["finish_reason"]) == ("def", "stop")
            assert r.json()["usage"]["completion_tokens"] == 4  # d e f g: the stop string's token counts, as in vLLM
    m = _metrics_once(client, "vllm:e2e_request_latency_seconds_count", 2)
    assert m["vllm:request_success_total{finished_reason=stop}"] == 2
    assert m["vllm:prompt_tokens_total"] == 6
    assert m["vllm:request_prompt_tokens_count"] == 2 and m["vllm:request_prompt_tokens_sum"] == 6
    assert m["vllm:time_to_first_token_seconds_count"] == 2
    assert m["vllm:e2e_request_latency_seconds_count"] == 2
    assert m["vllm:request_queue_time_seconds_count"] == 2
    # what was served (4 tokens each), not what the engine ran on before the abort landed
    assert m["vllm:request_generation_tokens_count"] == 2 and m["vllm:request_generation_tokens_sum"] == 8
    assert m["vllm:inter_token_latency_seconds_count"] == 6
    assert m["vllm:generation_tokens_total"] == 8  # (the tokens run past the stop were counted too)


def test_a_stop_string_read_after_the_choices_final_update_arrived_is_not_counted_twice() -> None:
    """The server's event loop may take in two of the engine's steps before the handler reads the first: a stop string
    in the first, the choice's last token (max_tokens) in the second. The engine's final update was counted as it
    arrived, then the stop string's abort counted the same choice again: two finished requests for one, and the
    stream's count of unfinished choices went below zero."""
    from tests.engine.test_server_api import _client_without_a_process, _success_counts

    sent = []
    client = _client_without_a_process(sent)
    stream = client.submit([[1, 2]], [None])
    _step(client, Update(stream.key, 0, [7], num_prompt_tokens=2))  # the stop string is in this token's text
    _step(client, Update(stream.key, 0, [8], True, "length", num_prompt_tokens=2,
                         timing=Timing(0.0, 0.0, array("d", [0.1, 0.2]))))
    client.abort(stream, 0, reason="stop", num_tokens=1)  # the handler reads the first update only now
    client._on_message(("aborted", stream.key, 0, []))  # the engine had finished it: nothing to end
    assert sum(_success_counts(client).values()) == 1
    assert stream.num_unfinished == 0
    assert client.metrics.e2e._sum.get() == 0.2  # observed once
    assert client._stopped == {} and client._aborted == {}


def _step(client, *updates) -> None:
    """A step message as the engine sends it: each update a tuple of its fields (its Timing kept whole)."""
    client._on_message(("step", 2, StepStats(0, 0, 0.0, 0, 0, 0, 0),
                        [tuple(getattr(u, f.name) for f in dataclasses.fields(u)) for u in updates]))
