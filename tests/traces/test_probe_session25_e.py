"""Hostile-input probe (session 25, E): what traces.bench prints of a server's own words (its error messages, the
model id it lists) when they hold ANSI escapes and carriage returns."""

from __future__ import annotations

import re

from aiohttp import web

from cli.traces_bench import main as bench_main
from tests.traces.fake_openai import FakeOpenAI
from tests.traces.test_bench import _trace

CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but tab and newline


class _Refusing(FakeOpenAI):
    """Lists ``model`` and refuses every completion with a 400 whose message holds an ANSI escape."""

    async def _completions(self, request: web.Request) -> web.Response:
        await request.json()
        return web.json_response({"error": {"message": "bad \x1b[31mRED\x1b[0m\rX"}}, status=400)


def test_a_servers_error_and_model_id_are_printed_escaped(tmp_path, capsys) -> None:
    """The first errors listed on stderr and the "served by" line quoted the server raw: its ANSI escape recoloured
    the terminal and its carriage return overwrote the line."""
    trace = _trace(tmp_path, [0.0, 0.01], [3, 4])
    with _Refusing(model="m\x1b[32mGREEN\x1b[0m\r<x>") as server:
        assert bench_main([server.url, str(trace), "--out", str(tmp_path / "out"), "--vocab-size", "512"]) == 1
    captured = capsys.readouterr()
    assert not CONTROLS.search(captured.out) and not CONTROLS.search(captured.err.replace("\r", ""))  # tqdm's \r
    assert "  request 'r0': HTTP 400: bad \\x1b[31mRED\\x1b[0m X" in captured.err.splitlines()
    assert captured.out.splitlines()[-1] == (f"served by {server.url} (model m\\x1b[32mGREEN\\x1b[0m\\r<x>); outputs "
                                             f"in {tmp_path}/out/")
