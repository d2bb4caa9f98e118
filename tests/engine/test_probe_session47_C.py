"""Hostile and unusual input for engine.serve and engine.LLM, session 47 (C): the fixes' tests.

SamplingParams took n=10**12: generate() then built requests until memory ran out (the server refuses n past its
queue, --max-waiting-requests). numpy's bools (np.True_, an element of a mask) were refused as ignore_eos and
include_stop_str_in_output, where numpy's ints and floats are taken as the numbers they are; and a dict as stop or
stop_token_ids was taken as its keys without a word.

Stop strings were each looked for from the released text less the longest of them: one stop string of 100,000
characters put that at the start, and every string rescanned the whole answer at each token, in the server's event
loop (64 strings, 40,000 tokens: 53 s for one request, 2 s without the long one).

engine.serve between the model's load and uvicorn's own signal handlers (the app is built, the event loop starts):
a Ctrl-C there was a KeyboardInterrupt traceback (exit -2), and a SIGTERM killed the server at once (exit -15), its
engine process left to Linux's parent-death signal, which logged an EOFError traceback. An engine process that could
not start (fork's EAGAIN at a process limit) was one line, then an AssertionError traceback from stopping it."""

from __future__ import annotations

import errno
import multiprocessing.context
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.sampling_params import MAX_N, SamplingParams
from tests.engine.helpers import SERVING, engine_processes, process_cmdline

N_PROBLEM = f"SamplingParams.n must be an int from 1 to {MAX_N} (each sample is a request of its own), got "


@pytest.mark.parametrize("n", [MAX_N + 1, 10**12])
def test_more_samples_than_the_bound_are_refused_with_the_reason(n) -> None:
    with pytest.raises(ValueError) as error:
        SamplingParams(n=n)
    assert str(error.value) == f"{N_PROBLEM}{n}"


def test_the_bound_itself_and_a_numpy_n_are_taken() -> None:
    assert SamplingParams(n=MAX_N).n == MAX_N
    n = SamplingParams(n=np.int64(3)).n
    assert (n, type(n)) == (3, int)


@pytest.mark.parametrize("field", ["ignore_eos", "include_stop_str_in_output"])
@pytest.mark.parametrize("value", [np.True_, np.False_])
def test_numpy_bools_are_python_bools(field, value) -> None:
    taken = getattr(SamplingParams(**{field: value}), field)
    assert type(taken) is bool
    assert taken is bool(value)


@pytest.mark.parametrize("field", ["ignore_eos", "include_stop_str_in_output"])
@pytest.mark.parametrize("value", [np.int64(1), 1, "yes", None])
def test_what_is_no_bool_is_still_refused(field, value) -> None:
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == f"SamplingParams.{field} must be True or False, got {value!r}"


@pytest.mark.parametrize(("field", "value", "message"), [
    ("stop", {"end": 1}, "SamplingParams.stop must be a string or a list of strings, got {'end': 1}"),
    ("stop_token_ids", {5: "eos"}, "SamplingParams.stop_token_ids must be a sequence of ints, got {5: 'eos'}"),
])
def test_a_dict_is_not_taken_as_its_keys(field, value, message) -> None:
    with pytest.raises(ValueError) as error:
        SamplingParams(**{field: value})
    assert str(error.value) == message


def test_generate_takes_numpy_bools(tiny_qwen3) -> None:
    from engine.llm import LLM

    model_dir, _ = tiny_qwen3
    with LLM(model_dir, device="cpu", max_model_len=64) as llm:
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=np.True_), use_tqdm=False)
    assert (len(out[0]["token_ids"]), out[0]["finish_reason"]) == (5, "length")


# ---- stop strings ------------------------------------------------------------------------------------------------
class _Letters:
    """Token i is the letter chr(ord('a') + i): one character a token, decoded at once."""

    def decode(self, ids, skip_special_tokens=True) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def _detokenize(stop: list[str], token_ids: list[int], chunks: list[int], min_tokens: int = 0,
                include: bool = False) -> tuple[str, str | None]:
    """(the released text, the stop string that ended it) of ``token_ids`` added in chunks of these sizes."""
    detokenizer = IncrementalDetokenizer(_Letters(), stop, include_stop_str=include, min_tokens=min_tokens)
    released, start = "", 0
    for size in chunks:
        released += detokenizer.add(token_ids[start:start + size])
        start += size
        if detokenizer.stopped:
            break
    else:
        released += detokenizer.finish()
    return released, detokenizer.stop_string


def _expected(stop: list[str], text: str, chunks: list[int], min_tokens: int,
              include: bool) -> tuple[str, str | None]:
    """The whole text searched afresh as each chunk comes: the earliest match that ends past the first min_tokens
    characters (of two there, the first listed) ends it."""
    end = 0
    for size in chunks:
        end += size
        so_far, unstoppable = text[:end], min(min_tokens, end)
        found = [(i, k) for k, s in enumerate(stop) if (i := so_far.find(s, max(unstoppable - len(s) + 1, 0))) >= 0]
        if found:
            position, k = min(found)
            return text[:position + len(stop[k]) if include else position], stop[k]
    return text, None


def test_stop_strings_end_the_text_at_their_earliest_match_however_the_tokens_come() -> None:
    rng = random.Random(47)
    for _ in range(3000):
        token_ids = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]  # letters a to c: matches are frequent
        stop = ["".join(rng.choice("abc") for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(1, 4))]
        chunks, left = [], len(token_ids)
        while left:
            chunks.append(min(left, rng.randrange(1, 5)))
            left -= chunks[-1]
        min_tokens, include = rng.randrange(0, 6), rng.random() < 0.5
        expected = _expected(stop, _Letters().decode(token_ids), chunks, min_tokens, include)
        assert _detokenize(stop, token_ids, chunks, min_tokens, include) == expected


def test_a_long_stop_string_does_not_make_the_others_rescan_the_answer() -> None:
    """The cost per token of 64 stop strings that never match stays that of 63 short ones when the 64th is 100,000
    characters long (it was 13 times that over 20,000 tokens, and grew with the answer)."""
    short = [f"z{i}" for i in range(63)]
    token_ids = [i % 25 for i in range(20_000)]  # never a "z"

    def seconds(stop: list[str]) -> float:
        start = time.perf_counter()
        assert _detokenize(stop, token_ids, [1] * len(token_ids)) == (_Letters().decode(token_ids), None)
        return time.perf_counter() - start

    shortest = min(seconds(short) for _ in range(2))
    with_long = min(seconds([*short, "z" * 100_000]) for _ in range(2))
    assert with_long < 4 * shortest, (with_long, shortest)


# ---- engine.serve: a signal between the model's load and uvicorn's handlers ------------------------------------------
# engine.serve with one step made slow: the app's build (before the server exists) or the start of the server's
# serve() (the event loop runs, uvicorn's handlers are not yet in place); it prints PAUSED on entering it.
_PAUSED = "PAUSED"
_WRAPPER = """
import asyncio, sys, time
if __name__ == "__main__":
    from engine.core.interrupt import run_command
    where = sys.argv.pop(1)
    if where == "build":
        import engine.server.api as api
        build_app = api.build_app
        def slow_build(*args, **kwargs):
            print("PAUSED", flush=True)
            time.sleep(3)
            return build_app(*args, **kwargs)
        api.build_app = slow_build
    else:
        import engine.server.signals as signals
        serve = signals.Server.serve
        async def slow_serve(self, sockets=None):
            print("PAUSED", flush=True)
            await asyncio.sleep(3)
            return await serve(self, sockets)
        signals.Server.serve = slow_serve
    run_command("cli.engine_serve")
"""


@pytest.mark.parametrize(("where", "signum", "returncode", "lines"), [
    # before the server exists: as a signal while the model loads, one line and 130 or 143
    ("build", signal.SIGTERM, 143, ["terminated before the server started"]),
    ("build", signal.SIGINT, 130, ["interrupted before the server started"]),
    # the server exists: the signal is its own, as while it serves; it starts and shuts down at once
    ("serve", signal.SIGTERM, 0, None),
    ("serve", signal.SIGINT, 0, None),
])
def test_a_signal_before_uvicorns_handlers_stops_the_server_cleanly(tiny_qwen3, tmp_path, where, signum, returncode,
                                                                     lines) -> None:
    model_dir, _ = tiny_qwen3
    wrapper = tmp_path / "serve_paused.py"
    wrapper.write_text(_WRAPPER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, str(wrapper), where, "--model", model_dir, "--device", "cpu", "--port", "0",
               "--warmup-requests", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.strip() == _PAUSED:
                break
        assert seen and seen[-1].strip() == _PAUSED, "".join(seen)
        engines = engine_processes(proc.pid)
        time.sleep(0.3)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == returncode, out
    if lines is not None:
        assert out.strip().splitlines() == lines, out
    else:  # (it may say it serves before the shutdown it was asked for)
        assert [line for line in out.strip().splitlines() if not line.startswith(SERVING)] == [], out
    assert engines and all(not process_cmdline(pid) or "\nState:\tZ" in open(f"/proc/{pid}/status").read()
                           for pid in engines)


def test_an_engine_process_that_cannot_start_is_one_line(tiny_qwen3, monkeypatch, capsys) -> None:
    from cli.engine_serve import main

    def cannot_start(process) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", cannot_start)
    model_dir, _ = tiny_qwen3
    with pytest.raises(SystemExit) as exited:
        main(["--model", model_dir, "--device", "cpu", "--port", "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: --model {model_dir}: [Errno 11] Resource temporarily unavailable\n"
