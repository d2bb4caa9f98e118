"""The engine's stop reason while the reader thread's word is still on its way: a health check that found the engine
process dead before the event loop took in its "error" message said only "its process exited" (the CI run of
efb58ec's tree failed test_keep_alive_on_engine_death_answers_503_until_stopped so); the exit code is known then."""

from __future__ import annotations

from types import SimpleNamespace

from engine.server.engine_client import EngineClient


def _client(process) -> EngineClient:
    client = EngineClient(lambda: None, model_name="m", max_waiting_requests=10)
    client._process = process
    return client


def test_a_dead_process_not_yet_reported_gives_its_exit_code() -> None:
    client = _client(SimpleNamespace(is_alive=lambda: False, exitcode=-9))
    assert not client.is_alive
    assert client.stop_reason == "the engine process exited (code -9)"


def test_the_reported_error_comes_first_and_an_unknown_code_is_not_made_up() -> None:
    client = _client(SimpleNamespace(is_alive=lambda: False, exitcode=-9))
    client.error = "CUDA out of memory"
    assert client.stop_reason == "CUDA out of memory"
    assert _client(SimpleNamespace(is_alive=lambda: False, exitcode=None)).stop_reason == "its process exited"
    assert _client(None).stop_reason == "its process exited"
