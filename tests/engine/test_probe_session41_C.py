"""Options that ask for more memory than there is, on both command lines of the engine: the line names every option
that sizes the allocation, --max-num-seqs among them (its per-sequence buffers), and engine.serve says what
engine.replay says rather than quoting torch's allocator after the model's name. And the server checks a request's
stop_token_ids once, not once per choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.engine_replay import main as replay_main
from cli.engine_serve import main as serve_main
from tests.traces.helpers import cli_error

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
from tests.engine import test_server_api  # noqa: E402
from tests.engine.test_server_api import expected_tokens  # noqa: E402

served = test_server_api.served  # the fixture: a scripted engine process behind the app, through a TestClient

ALLOCATOR = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
             "allocate 1026148007936 bytes. Error code 12 (Cannot allocate memory)")
HINT = "lower --max-num-seqs, --num-gpu-blocks, --max-num-batched-tokens or --gpu-memory-utilization"


def _refuses_one_terabyte() -> bool:
    """Whether this host refuses an allocation of 1 TB outright (Linux's default overcommit heuristic, or none at all),
    rather than handing out pages it may never have."""
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() in ("0", "2")
    except OSError:
        return False


@pytest.mark.skipif(not _refuses_one_terabyte(), reason="this host overcommits memory: 1 TB would be handed out")
def test_engine_replay_names_max_num_seqs_when_its_buffers_do_not_fit(tiny_qwen3, trace, tmp_path, capsys) -> None:
    """--max-num-seqs 10**9 on the CPU asks for ~1 TB of per-sequence buffers: the line said to lower --num-gpu-blocks,
    --max-num-batched-tokens or --gpu-memory-utilization, none of which was the cause."""
    out = tmp_path / "out"
    argv = [str(trace), "--model", tiny_qwen3[0], "--device", "cpu", "--out", str(out), "--max-num-seqs", str(10**9)]
    line = cli_error(replay_main, argv, capsys)
    assert line.startswith(f"error: {tiny_qwen3[0]} does not fit in memory with these options ([enforce fail")
    assert line.endswith(HINT)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


def _engine_that_fails_to_start(monkeypatch, message: str) -> None:
    """engine.serve's engine process fails while loading with ``message``, as EngineClient.start reports it."""
    import engine.server.engine_client

    class Client:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            raise RuntimeError(message)

        def stop(self, **kwargs):
            pass

    monkeypatch.setattr(engine.server.engine_client, "EngineClient", Client)


def test_engine_serve_says_the_options_do_not_fit_as_engine_replay_does(tiny_qwen3, capsys, monkeypatch) -> None:
    """The engine process reports its allocation failure as text; the server quoted it after --model, naming no
    option."""
    _engine_that_fails_to_start(monkeypatch, f"RuntimeError: {ALLOCATOR}")
    line = cli_error(serve_main, ["--model", tiny_qwen3[0], "--device", "cpu", "--port", "0",
                                  "--max-num-seqs", str(10**9)], capsys)
    assert line == (f"error: {tiny_qwen3[0]} does not fit in memory with these options (RuntimeError: {ALLOCATOR}); "
                    f"{HINT}")


def test_engine_serve_quotes_other_start_failures_after_the_model(tiny_qwen3, capsys, monkeypatch) -> None:
    _engine_that_fails_to_start(monkeypatch, "the engine process exited with code -9 while loading")
    line = cli_error(serve_main, ["--model", tiny_qwen3[0], "--device", "cpu", "--port", "0"], capsys)
    assert line == f"error: --model {tiny_qwen3[0]}: the engine process exited with code -9 while loading"


def test_a_requests_stop_token_ids_are_checked_once_for_all_its_choices(served, monkeypatch) -> None:
    """Each choice checked the ids against the vocabulary and copied them into a set of its own, in the event loop:
    200 prompts with 100,000 stop_token_ids (a 390 KB body) held /health and every stream for 18 s, 400 for 36 s."""
    client = served()
    submitted = []
    submit = client.engine_client.submit

    def recording_submit(prompts, params):
        submitted.extend(params)
        return submit(prompts, params)

    monkeypatch.setattr(client.engine_client, "submit", recording_submit)
    stop_token_ids = [90 + i % 9 for i in range(100_000)]  # the scripted runner samples 0-89: none of them stops it
    r = client.post("/v1/completions", json={"prompt": [[5 + i % 80] for i in range(400)], "max_tokens": 2,
                                             "stop_token_ids": stop_token_ids, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert [c["token_ids"] for c in r.json()["choices"]] == [expected_tokens([5 + i % 80], 2) for i in range(400)]
    assert len(submitted) == 400 and len({id(p.stop_token_ids) for p in submitted}) == 1
    assert submitted[0].stop_token_ids == frozenset(range(90, 99))
    r = client.post("/v1/completions", json={"prompt": [[1], [2]], "max_tokens": 2, "stop_token_ids": [5, 100]})
    assert r.status_code == 400 and r.json()["error"] == {
        "message": "stop_token_ids has 100, outside the vocabulary", "type": "invalid_request_error",
        "param": "stop_token_ids", "code": 400}
