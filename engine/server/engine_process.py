"""The engine's own process: the step loop, fed through a pipe by the HTTP server's process.

Why a process and not a thread: the HTTP side spends tens of microseconds of Python per streamed token
(framing, JSON, the socket write). In one process that work holds the GIL the step loop needs to
prepare and launch its next step, and measured on a scripted engine it stretched decode steps by
13-20 % at 100-200 concurrent streams. vLLM (engine core) and SGLang (scheduler) run their step loop in
a process of its own for the same reason.

Protocol. Commands (server -> engine) are tuples drained at every step boundary, so a request joins the
very next step after it arrives; while nothing runs the loop blocks on the pipe:
``("add", key, prompts, params, arrival)``, ``("abort", key, index | None)``, ``("metrics", ticket)``,
``("stop",)``. Messages (engine -> server): ``("ready", EngineInfo)`` once, then per step
``("step", num_drained, num_waiting, updates)`` with one ``Update`` per request choice that produced
tokens or finished, ``("metrics", ticket, bytes)``, and ``("error", message)`` when the loop dies.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

from engine.core.config import EngineConfig
from engine.core.sequence import Sequence

_log = logging.getLogger(__name__)

# The step log is the engine's record of every step; a server runs for days, so it is dropped this often
# (a server reports through its metrics).
STEP_LOG_MAX_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the server needs to check requests before they reach the engine."""

    config: EngineConfig  # resolved: num_gpu_blocks and max_model_len known
    vocab_size: int
    model_dir: str


@dataclass(frozen=True, slots=True)
class Update:
    """New output of one choice of a request after a step."""

    key: int  # the request
    index: int  # its choice
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


def run_engine(factory: Callable[[], object], model_name: str, commands: Connection, messages: Connection) -> None:
    """The engine process's main: build the engine with ``factory`` (an ``engine.LLM`` or anything with its
    ``engine``, ``shape``, ``model_dir`` and ``close``), say ready, then serve commands until told to stop."""
    # Ctrl-C reaches the whole process group: the server shuts down and stops this loop itself, between steps.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        import prometheus_client

        from engine.server.metrics import ServerMetrics

        prometheus_client.disable_created_metrics()  # this process is ours; vLLM's scrape has no *_created either
        llm = factory()
        engine = llm.engine
        metrics = ServerMetrics(model_name, engine)
        messages.send(("ready", EngineInfo(engine.config, llm.shape.vocab_size, str(llm.model_dir))))
    except BaseException as exc:  # noqa: BLE001 - whatever stopped the load is the server's one-line error
        messages.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    try:
        _Loop(engine, metrics, commands, messages).run()
    except BaseException as exc:  # noqa: BLE001 - the server must learn why the loop stopped
        _log.error("the engine loop stopped:\n%s", traceback.format_exc())
        try:
            messages.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        close = getattr(llm, "close", None)
        if close is not None:
            close()


class _Loop:
    def __init__(self, engine, metrics, commands: Connection, messages: Connection) -> None:
        self.engine = engine
        self.metrics = metrics
        self.commands = commands
        self.messages = messages
        self.choices: dict[int, tuple[int, int]] = {}  # seq_id -> (request key, choice index)
        self.seqs: dict[int, list[Sequence]] = {}  # request key -> its sequences, by choice
        self.sent: dict[int, int] = {}  # seq_id -> completion tokens already sent
        self.num_drained = 0  # choices taken into the scheduler so far
        self.running = True

    def run(self) -> None:
        engine, commands = self.engine, self.commands
        while self.running:
            while commands.poll():
                self.handle(commands.recv())
            if not self.running:
                break
            if not engine.has_unfinished_requests():
                commands.poll(None)  # idle: sleep until the next command
                continue
            batch, finished = engine.step()
            updates, num_generated = self.collect(batch)
            self.metrics.on_step(batch, finished, num_generated)
            for seq in finished:
                self.forget(seq)
            self.messages.send(("step", self.num_drained, len(engine.scheduler.waiting), updates))
            if len(engine.step_log) >= STEP_LOG_MAX_ROWS:
                engine.step_log.clear()

    def handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self.add(*command[1:])
        elif kind == "abort":
            self.abort(*command[1:])
        elif kind == "metrics":
            self.messages.send(("metrics", command[1], self.metrics.exposition()))
        elif kind == "stop":
            self.running = False
        else:
            raise ValueError(f"unknown command {kind!r}")

    def add(self, key: int, prompts: list[list[int]], params: list, arrival_wall_s: float) -> None:
        engine = self.engine
        # The request arrived at the server's receipt (wall time), earlier than this drain by the pipe's latency.
        arrival_s = engine.clock.now() - max(time.time() - arrival_wall_s, 0.0)
        seqs = []
        rejected = []
        for index, (ids, sp) in enumerate(zip(prompts, params)):
            seq = engine.add_request(ids, sp, request_id=f"{key}-{index}", arrival_s=arrival_s)
            seqs.append(seq)
            if seq.is_finished:  # the server checks lengths first: only a limit it missed lands here
                rejected.append(Update(key, index, [], True, seq.finish_reason.value, seq.reject_reason,
                                       seq.num_prompt_tokens))
            else:
                self.choices[seq.seq_id] = (key, index)
                self.sent[seq.seq_id] = 0
        self.seqs[key] = seqs
        self.num_drained += len(prompts)
        if rejected:
            self.messages.send(("step", self.num_drained, len(engine.scheduler.waiting), rejected))

    def abort(self, key: int, index: int | None) -> None:
        seqs = self.seqs.get(key, [])
        for seq in seqs if index is None else seqs[index:index + 1]:
            if not seq.is_finished:
                self.engine.abort_request(seq)
                self.metrics.on_finished(seq)
            self.forget(seq)

    def forget(self, seq: Sequence) -> None:
        entry = self.choices.pop(seq.seq_id, None)
        self.sent.pop(seq.seq_id, None)
        if entry is not None:
            key = entry[0]
            seqs = self.seqs.get(key)
            if seqs is not None and all(s.is_finished for s in seqs):
                del self.seqs[key]

    def collect(self, batch) -> tuple[list[Update], int]:
        """Each tracked choice's new tokens; and how many tokens the step sampled."""
        updates = []
        num_generated = 0
        choices, sent = self.choices, self.sent
        for seq in batch.seqs:
            entry = choices.get(seq.seq_id)
            if entry is None:
                continue
            produced = seq.num_completion_tokens
            already = sent[seq.seq_id]
            finished = seq.is_finished
            if produced == already and not finished:
                continue  # a prompt chunk: nothing sampled yet
            sent[seq.seq_id] = produced
            new = seq.token_ids[seq.num_prompt_tokens + already:]
            num_generated += len(new)
            key, index = entry
            if finished:
                reason = seq.finish_reason.value if seq.finish_reason is not None else None
                updates.append(Update(key, index, new, True, reason, seq.error, seq.num_prompt_tokens,
                                      seq.num_cached_tokens))
            else:
                updates.append(Update(key, index, new, False))
        return updates, num_generated



def load_llm(model: str, options: dict, warmup_requests: int = 0) -> object:
    """The engine process's factory for ``engine.serve``: ``engine.LLM(model, **options)``, warmed up with
    ``warmup_requests`` short requests so the first clients do not pay for kernel compilation."""
    from engine.llm import LLM

    llm = LLM(model, **options)
    llm.warm_up(warmup_requests)
    return llm
