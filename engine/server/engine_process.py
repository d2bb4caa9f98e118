"""The engine's own process: the step loop, fed through a pipe by the HTTP server's process.

Why a process and not a thread: the HTTP side spends tens of microseconds of Python per streamed token
(framing, JSON, the socket write). In one process that work holds the GIL the step loop needs to
prepare and launch its next step, and measured on a scripted engine it stretched decode steps by
13-20 % at 100-200 concurrent streams. vLLM (engine core) and SGLang (scheduler) run their step loop in
a process of its own for the same reason.

Protocol. Commands (server -> engine) are tuples drained at every step boundary, so a request joins the
very next step after it arrives; while nothing runs the loop blocks on the pipe:
``("add", key, prompts, params, arrival)``, ``("abort", key, index | None)``, ``("stop",)``. Messages
(engine -> server): ``("ready", EngineInfo)`` once, then per step ``("step", num_drained, StepStats,
updates)`` with one update per request choice that produced tokens or finished, ``("aborted", key, index,
ended)`` once an abort is taken in (``ended``: (index, prompt tokens, ``Timing``) of a choice a stop string ended),
and ``("error", message)``
when the loop dies. Updates travel as plain tuples of ``Update``'s fields (a dataclass pickles 20-40x
slower: benchmarks/server_loop.py), and the metrics are kept by the server's process from these
messages: every microsecond spent here is a microsecond every running request waits for its next token.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import NamedTuple

from engine.core.config import EngineConfig
from engine.core.generation_defaults import LOGGER_NAME, GenerationDefaults
from engine.core.interrupt import defer_sigterm_to_parent, exit_with_parent
from engine.core.messages import exception_line
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
    generation_defaults: GenerationDefaults = GenerationDefaults()  # of requests that leave sampling fields out


class StepStats(NamedTuple):
    """The engine's state after a step, for the server's gauges and counters."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_queried_tokens: int  # prompt tokens looked up in the prefix cache so far
    num_hit_tokens: int  # ... and found there
    num_preempted: int  # in this step
    num_batched_tokens: int  # in this step


@dataclass(frozen=True, slots=True)
class Timing:
    """A finished choice's times on the engine's clock (seconds): what its latency histograms are made of."""

    arrival_s: float
    first_scheduled_s: float | None
    token_times_s: array


@dataclass(frozen=True, slots=True)
class Update:
    """New output of one choice of a request after a step (sent as a tuple of these fields, in this order)."""

    key: int  # the request
    index: int  # its choice
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    timing: Timing | None = None


def _report(messages: Connection, exc: BaseException) -> None:
    """Tell the server in one line why the engine stopped; a SIGTERM (exit_with_parent raises SystemExit) says so,
    wherever it lands: while the engine loads, or, once the server is gone, just after it said ready or in the loop."""
    if isinstance(exc, SystemExit):
        line = f"the engine process was stopped by a signal (exit {exc.code})"
    else:  # one line: a message of several (transformers', torch's) broke the server's one-line error
        line = exception_line(exc, None)
    try:
        messages.send(("error", line))
    except OSError:  # the server is gone (exit_with_parent): nobody to tell
        pass


def run_engine(factory: Callable[[], object], commands: Connection, messages: Connection) -> None:
    """The engine process's main: build the engine with ``factory`` (an ``engine.LLM`` or anything with its
    ``engine``, ``shape``, ``model_dir`` and ``close``), say ready, then serve commands until told to stop."""
    # Ctrl-C reaches the whole process group: the server shuts down and stops this loop itself, between steps.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        llm = factory()
        engine = llm.engine
        gc.collect()
        gc.freeze()  # the model and the warm-up's leftovers: out of the collector's sight, as engine.replay does
        # A factory without generation defaults (the tests' scripted engines) gets vLLM's neutral ones.
        defaults = getattr(llm, "generation_defaults", GenerationDefaults())
        # From "ready" on the server stops this loop itself, after draining its requests: a SIGTERM is the server's
        # (defer_sigterm_to_parent says why). While the model loads it unwinds the load, which the server stops anyway.
        defer_sigterm_to_parent(pass_on=True)
        messages.send(("ready", EngineInfo(engine.config, llm.shape.vocab_size, str(llm.model_dir), defaults)))
    except BaseException as exc:  # noqa: BLE001 - whatever stopped the load is the server's one-line error
        _report(messages, exc)
        return
    try:
        _Loop(engine, commands, messages).run()
    except BaseException as exc:  # noqa: BLE001 - the server must learn why the loop stopped
        # SIGTERM once the server is gone (exit_with_parent) is no failure to log
        if not isinstance(exc, SystemExit):
            _log.error("the engine loop stopped:\n%s", traceback.format_exc())
        _report(messages, exc)
    finally:
        close = getattr(llm, "close", None)
        if close is not None:
            close()


class _Loop:
    def __init__(self, engine, commands: Connection, messages: Connection) -> None:
        self.engine = engine
        self.commands = commands
        self.messages = messages
        self.choices: dict[int, list] = {}  # seq_id -> [request key, choice index, completion tokens sent]
        self.seqs: dict[int, list[Sequence]] = {}  # request key -> its sequences, by choice
        self.num_drained = 0  # choices taken into the scheduler so far
        self.running = True

    def run(self) -> None:
        engine, commands = self.engine, self.commands
        if hasattr(engine.runner, "arrivals_pending"):  # a command waiting: hold back a step launched ahead
            engine.runner.arrivals_pending = commands.poll
        while self.running:
            while commands.poll():
                self.handle(commands.recv())
            if not self.running:
                break
            if not engine.has_unfinished_requests():
                commands.poll(None)  # idle: sleep until the next command
                continue
            self.after_step(*engine.step())

    def after_step(self, batch, finished) -> None:
        """Everything the loop does per step besides the step itself (benchmarks/server_loop.py times it)."""
        self.send_state(self.collect(batch), len(batch.preempted), batch.num_batched_tokens)
        for seq in finished:
            self.forget(seq)
        if len(self.engine.step_log) >= STEP_LOG_MAX_ROWS:
            self.engine.step_log.clear()

    def handle(self, command: tuple) -> None:
        kind = command[0]
        if kind == "add":
            self.add(*command[1:])
        elif kind == "abort":
            self.abort(*command[1:])
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
                rejected.append((key, index, [], True, seq.finish_reason.value, seq.reject_reason,
                                 seq.num_prompt_tokens))
            else:
                self.choices[seq.seq_id] = [key, index, 0]
        if not all(seq.is_finished for seq in seqs):  # one whose every choice was rejected has nothing to abort or
            self.seqs[key] = seqs                        # forget later: kept, it stayed here for the server's life
        self.num_drained += len(prompts)
        if rejected:
            self.send_state(rejected)

    def abort(self, key: int, index: int | None) -> None:
        seqs = self.seqs.get(key, [])
        # One choice is aborted only when a stop string ended it in the server: a finished request to the metrics (as
        # in vLLM, whose engine checks stop strings), whose prompt, latencies and length were never counted.
        ended = []
        for seq in seqs if index is None else seqs[index:index + 1]:
            if not seq.is_finished:
                if index is not None:
                    ended.append((index, seq.num_prompt_tokens,
                                  Timing(seq.arrival_s, seq.first_scheduled_s, seq.token_times_s)))
                self.engine.abort_request(seq)
            self.forget(seq)
        self.send_state([])  # the gauges must see the freed blocks even if no step follows
        self.messages.send(("aborted", key, index, ended))  # after it no update of these choices comes (metrics)

    def send_state(self, updates: list[tuple], num_preempted: int = 0, num_batched_tokens: int = 0) -> None:
        """The queues and cache as they are now, with a step's updates (or outside a step: no preemptions, no
        tokens)."""
        scheduler = self.engine.scheduler
        block_manager = scheduler.block_manager
        self.messages.send(("step", self.num_drained, StepStats(
            len(scheduler.running), len(scheduler.waiting), block_manager.usage,
            block_manager.num_queried_tokens, block_manager.num_hit_tokens, num_preempted, num_batched_tokens),
            updates))

    def forget(self, seq: Sequence) -> None:
        entry = self.choices.pop(seq.seq_id, None)
        if entry is not None:
            key = entry[0]
            seqs = self.seqs.get(key)
            if seqs is not None and all(s.is_finished for s in seqs):
                del self.seqs[key]

    def collect(self, batch) -> list[tuple]:
        """Each tracked choice's new tokens after a step, as update tuples."""
        updates = []
        choices = self.choices
        for seq in batch.seqs:
            entry = choices.get(seq.seq_id)
            if entry is None:
                continue
            tokens = seq.token_ids
            already = seq.num_prompt_tokens + entry[2]
            if len(tokens) == already and not seq.is_finished:
                continue  # a prompt chunk: nothing sampled yet
            first = entry[2] == 0
            entry[2] = len(tokens) - seq.num_prompt_tokens
            new = tokens[already:]
            if seq.is_finished:
                reason = seq.finish_reason.value if seq.finish_reason is not None else None
                updates.append((entry[0], entry[1], new, True, reason, seq.error, seq.num_prompt_tokens,
                                seq.num_cached_tokens, Timing(seq.arrival_s, seq.first_scheduled_s, seq.token_times_s)))
            elif first:  # the prompt's cached tokens are known from its first token on: a stream's usage so far says so
                updates.append((entry[0], entry[1], new, False, None, None, seq.num_prompt_tokens,
                                seq.num_cached_tokens))
            else:
                updates.append((entry[0], entry[1], new))
        return updates


def load_llm(model: str, options: dict, warmup_requests: int = 0) -> object:
    """The engine process's factory for ``engine.serve``: ``engine.LLM(model, **options)``, warmed up with
    ``warmup_requests`` short requests so the first clients do not pay for kernel compilation."""
    from engine.llm import LLM

    # engine.serve printed what the model's generation config sets before this process started: not twice
    logging.getLogger(LOGGER_NAME).setLevel(logging.ERROR)
    llm = LLM(model, **options)
    llm.warm_up(warmup_requests)
    return llm
