"""Probe B of session 25: ``python -m traces.bench`` against a server that answers JSON no parser takes (arrays nested
thousands deep, integers of thousands of digits): a failed request, or one line naming the URL, never a traceback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from tests.traces.fake_openai import FakeOpenAI
from tests.traces.test_bench import _bench, _error_line, _trace
from traces.http_bench import BenchResult, _on_event, _server_message, first_model

NESTED = "[" * 100_000  # json.loads raises RecursionError, not a JSONDecodeError
BIG_INT = "1" * 5_000  # json.loads raises a plain ValueError that advises sys.set_int_max_str_digits()


@pytest.mark.parametrize(("data", "why"), [
    (NESTED, "arrays or objects nested too deeply"),
    ('{"usage": {"prompt_tokens": ' + BIG_INT + "}}", "a number of more than 4300 digits"),
], ids=["nested", "big-int"])
def test_an_event_no_json_parser_takes_fails_its_request(data, why) -> None:
    """A RecursionError traceback out of the whole replay (exit 1, nothing written), or the request's error
    "ValueError: Exceeds the limit (4300 digits) for integer string conversion: ... use
    sys.set_int_max_str_digits()"."""
    with pytest.raises(ValueError) as info:
        _on_event(data, BenchResult(request_id="r", scheduled_s=0.0), 1.0)
    assert str(info.value).startswith(f"not a JSON event ({why}): ")


@pytest.mark.parametrize("body", [NESTED, '{"error": {"message": ' + BIG_INT + "}}"], ids=["nested", "big-int"])
def test_an_error_body_no_json_parser_takes_is_quoted(body) -> None:
    """A 500 whose body nested too deeply was a RecursionError traceback out of the replay."""
    assert _server_message(body.encode()) == body[:297] + "..."


class _Garbage(FakeOpenAI):
    """Lists its model, then answers every completion with ``answer``: a status and a body."""

    answer: tuple[int, str] = (200, "")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        status, text = self.answer
        if status != 200:
            return web.Response(status=status, text=text, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {text}\n\n".encode())
        await response.write_eof()
        return response


@pytest.mark.parametrize(("answer", "error"), [
    ((200, NESTED), "ValueError: not a JSON event (arrays or objects nested too deeply): [[[["),
    ((500, NESTED), "HTTP 500: [[[["),
], ids=["event", "error-body"])
def test_the_replay_records_such_answers_as_failed_requests(tmp_path, capsys, answer, error) -> None:
    import polars as pl

    trace = _trace(tmp_path, [0.0, 0.01], [3, 4])
    with _Garbage() as server:
        server.answer = answer
        assert _bench(server, trace, tmp_path / "out", "--vocab-size", "512") == 1  # every request failed
    assert "Traceback" not in capsys.readouterr().err
    errors = pl.read_parquet(tmp_path / "out" / "requests.parquet")["error"].to_list()
    assert len(errors) == 2 and all(e.startswith(error) for e in errors), errors


@pytest.mark.parametrize(("listing", "why"), [
    (NESTED, "arrays or objects nested too deeply"),
    ('{"data": [{"id": ' + BIG_INT + "}]}", "a number of more than 4300 digits"),
], ids=["nested", "big-int"])
def test_a_model_listing_no_json_parser_takes_is_one_line_naming_the_url(tmp_path, capsys, listing, why) -> None:
    """A RecursionError traceback at exit 1; 'error: Exceeds the limit (4300 digits) for integer string conversion:
    ... use sys.set_int_max_str_digits() to increase the limit', which named neither the server nor its answer."""

    class Listing(FakeOpenAI):
        async def _models(self, request):
            return web.Response(text=listing, content_type="application/json")

    with Listing() as server:
        with pytest.raises(ValueError) as info:
            asyncio.run(first_model(server.url))
        assert str(info.value) == f"{server.url}/v1/models: the answer is not JSON ({why})"
        with pytest.raises(SystemExit) as exit_info:
            _bench(server, _trace(tmp_path, [0.0], [3]), tmp_path / "out", "--vocab-size", "512")
    assert exit_info.value.code == 2
    assert _error_line(capsys.readouterr().err) == f"error: {server.url}/v1/models: the answer is not JSON ({why})"
    assert not (tmp_path / "out").exists()
