"""The engine process never outlives the server that started it, even one killed with SIGKILL (which cannot
stop it): on Linux it is sent SIGTERM when its parent dies and exits, here while still loading its model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = """
import functools, multiprocessing, time
from engine.server.engine_process import run_engine
if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    commands, _ = ctx.Pipe()
    _, messages = ctx.Pipe()
    loading = functools.partial(time.sleep, 120)  # a model load that takes two minutes
    engine = ctx.Process(target=run_engine, args=(loading, commands, messages), name="engine")
    engine.start()
    print(engine.pid, flush=True)
    time.sleep(120)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited, not yet reaped by whoever adopted it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_an_engine_still_loading_exits_when_its_server_is_killed() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        engine_pid = int(server.stdout.readline())
        time.sleep(3.0)  # the engine process has imported its modules and is "loading"
        assert not _gone(engine_pid)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        deadline = time.monotonic() + 15
        while not _gone(engine_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(engine_pid), "the engine process outlived its killed server"
    finally:
        server.kill()
        server.wait(timeout=10)


def test_a_request_the_engine_rejects_whole_is_not_kept() -> None:
    """The loop kept every request's sequences until their choices were forgotten; a request rejected at once by the
    engine (a limit the server's own checks missed) had no choice to forget, and stayed for the server's life."""
    from multiprocessing import Pipe

    from engine.core.sampling_params import SamplingParams
    from engine.server.engine_process import _Loop
    from tests.engine.test_server_api import ScriptedRunner, scripted_llm

    llm = scripted_llm(ScriptedRunner, {}, {})
    commands, _ = Pipe()
    messages, received = Pipe()
    loop = _Loop(llm.engine, commands, messages)
    params = SamplingParams(max_tokens=2)
    loop.add(1, [[1] * 300], [params], time.time())  # over max_model_len=256
    assert 1 not in loop.seqs and received.recv()[3][0][4] == "rejected"
    loop.add(2, [[1] * 300, [1, 2, 3]], [params, params], time.time())  # one choice runs: kept until it finishes
    assert 2 in loop.seqs
    while llm.engine.has_unfinished_requests():
        loop.after_step(*llm.engine.step())
    assert loop.seqs == {} and loop.choices == {}


# A server's side of a loaded engine, in a child script: the engine started (spawned, as engine.serve starts it) and
# ready; `commands` and `received` are the server's ends of its pipes.
ENGINE_READY = """
    ctx = multiprocessing.get_context("spawn")
    receiver, commands = ctx.Pipe(duplex=False)
    received, messages = ctx.Pipe(duplex=False)
    engine = ctx.Process(target=run_engine, name="engine",
                         args=(functools.partial(scripted_llm, ScriptedRunner, {}, {}), receiver, messages))
    engine.start()
    assert received.recv()[0] == "ready"
"""

SIGTERM_WHILE_THE_SERVER_LIVES = """
import functools, multiprocessing, os, signal, sys, time
from engine.core.sampling_params import SamplingParams
from engine.server.engine_process import run_engine
from tests.engine.test_server_api import ScriptedRunner, scripted_llm
if __name__ == "__main__":
    received_sigterm = []
    signal.signal(signal.SIGTERM, lambda signum, frame: received_sigterm.append(signum))
""" + ENGINE_READY + """    if sys.argv[1] == "group":
        os.killpg(os.getpgid(0), signal.SIGTERM)  # what systemd, `timeout` and `kill -- -PGID` send
    else:
        os.kill(engine.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while not received_sigterm and time.monotonic() < deadline:
        time.sleep(0.01)
    commands.send(("add", 0, [[1, 2, 3]], [SamplingParams(max_tokens=2)], time.time()))
    tokens = []
    while True:
        message = received.recv()
        if message[0] == "error":  # the engine stopped on the SIGTERM
            print("the engine stopped:", message[1], flush=True)
            break
        updates = message[3] if message[0] == "step" else []
        tokens += [t for u in updates for t in u[2]]
        if any(len(u) > 3 and u[3] for u in updates):
            print("served", tokens, [u[4] for u in updates], flush=True)
            break
    commands.send(("stop",))
    engine.join(30)
    print("sigterms", len(received_sigterm), "engine exit", engine.exitcode, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
@pytest.mark.parametrize(("sent_to", "num_sigterms"), [("engine", 1), ("group", 2)])
def test_a_sigterm_to_a_loaded_engine_is_its_servers_graceful_shutdown(sent_to, num_sigterms) -> None:
    """A SIGTERM sent to the whole group (systemd's KillMode=control-group, `timeout`, `kill -- -PGID`) stopped the
    engine at once: the server failed its requests in flight with a 500 and exited 1 with an error, where a SIGTERM to
    the server alone drains them and exits 0. The engine now passes a SIGTERM on to the server, and serves on until the
    server stops it; sent to the engine alone, the SIGTERM still shuts the server down."""
    done = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_THE_SERVER_LIVES, sent_to], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["served [4, 5] ['length']",
                                        f"sigterms {num_sigterms} engine exit 0"]


STOPPED_WITH_ITS_SERVER = """
import functools, multiprocessing, os
from engine.server.engine_process import run_engine
from tests.engine.test_server_api import ScriptedRunner, scripted_llm
if __name__ == "__main__":
""" + ENGINE_READY + """    print(engine.pid, flush=True)
    os._exit(0)  # the server is gone without stopping its engine: it is sent SIGTERM (parent-death signal)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_loaded_engine_whose_server_is_gone_exits() -> None:
    """The SIGTERM of the parent-death signal, once the server is gone, is not passed on: the engine exits."""
    done = subprocess.run([sys.executable, "-c", STOPPED_WITH_ITS_SERVER], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr
    engine_pid = int(done.stdout)
    deadline = time.monotonic() + 15
    while not _gone(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(engine_pid), "the engine process outlived its server"


def test_a_load_error_of_several_lines_reaches_the_server_as_one() -> None:
    """transformers' and torch's messages run over several lines (a tokenizer that cannot load: five); the server
    prints what the engine process reports as its one-line error, which was then several."""
    import multiprocessing

    from engine.server.engine_process import _report

    sender, receiver = multiprocessing.Pipe()
    _report(sender, ValueError("Couldn't instantiate the tokenizer from one of: \n(1) a file, \n(2) a slow one"))
    assert receiver.recv() == ("error", "ValueError: Couldn't instantiate the tokenizer from one of: (1) a file, (2) a "
                                        "slow one")
