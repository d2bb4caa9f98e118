"""The server's handle on the engine process (``engine_process``): submit, abort, scrape, health.

Called from the event loop only. A reader thread blocks on the engine's pipe and hands each step's
updates to the event loop in one ``call_soon_threadsafe``, where they land on each request's queue.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.sampling_params import SamplingParams
from engine.server.engine_process import EngineInfo, Update, run_engine
from engine.server.metrics import ServerMetrics

_log = logging.getLogger(__name__)


class ServerOverloaded(Exception):
    """The waiting queue is at its limit."""


class EngineDead(Exception):
    """The engine process has stopped."""


@dataclass(eq=False)
class RequestStream:
    """One HTTP request's choices and the queue their updates arrive on."""

    key: int
    num_open: int  # choices whose last update the handler has not yet read
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    num_unfinished: int = -1  # choices whose last update has not yet arrived from the engine
    # ... and the indices of those whose last update did arrive (and was counted): a stop string the handler reads
    # in an earlier update of such a choice ends nothing more
    arrived: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.num_unfinished < 0:
            self.num_unfinished = self.num_open

    async def updates(self, is_alive: Callable[[], bool]):
        """Every update until each choice has finished. Should the engine die with an update never sent,
        the wait ends within a second with an error for every choice still open."""
        queue = self.queue
        while self.num_open:
            if queue.empty():
                # asyncio.wait, not wait_for: on Python 3.11 wait_for swallows a cancel that lands as an update arrives,
                # and the reader of a request whose client had left waited on a dropped stream for the server's life
                getter = asyncio.ensure_future(queue.get())
                try:
                    await asyncio.wait((getter,), timeout=1.0)
                finally:
                    getter.cancel()  # (a no-op once it has its update)
                if not getter.done() or getter.cancelled():
                    if not is_alive():
                        for _ in range(self.num_open):
                            yield Update(self.key, -1, [], True, "error", "the engine process stopped")
                        return
                    continue
                update = getter.result()
            else:
                update = queue.get_nowait()
            if update.finished:
                self.num_open -= 1
            yield update


class EngineClient:
    def __init__(self, factory: Callable[[], object], *, model_name: str, max_waiting_requests: int) -> None:
        self.factory = factory
        self.model_name = model_name
        self.max_waiting_requests = max_waiting_requests
        self.info: EngineInfo | None = None
        self.error: str | None = None
        self._process = None
        self._commands = None
        self._messages = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[int, RequestStream] = {}
        # Choices counted when aborted, until the engine says it took the abort in: an update of theirs already on its
        # way (finished in the step the abort missed) must not be counted a second time. request key -> its aborted
        # choice indices (None: all of them).
        self._aborted: dict[int, set[int] | None] = {}
        # Choices a stop string ended, until the engine's timing of them arrives for the request metrics: (request key,
        # choice index) -> completion tokens served (the engine may have run on before the abort landed).
        self._stopped: dict[tuple[int, int], int] = {}
        self._keys = itertools.count()
        self.metrics = ServerMetrics(model_name)
        self._num_submitted = 0  # choices sent to the engine ...
        self._num_drained = 0  # ... and taken into its scheduler, as its last message said
        self._num_waiting = 0  # the engine's waiting queue after its last step
        self._stopping = False
        self._closing: str | None = None  # set once the server ends its open requests (end_open_requests): no new ones
        # Called on the event loop, with the reason, when the engine process stops without being asked to (it crashed,
        # was killed, ran out of memory): the server then shuts down, as vLLM's does (engine.serve).
        self.on_engine_death: Callable[[str], object] | None = None

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout_s: float = 600.0) -> EngineInfo:
        """Start the engine process and wait until its model is loaded; raises RuntimeError with the
        engine's own one-line reason if it fails to start."""
        # spawn, not fork: the engine initialises CUDA, which a forked child of a threaded parent cannot.
        ctx = multiprocessing.get_context("spawn")
        commands_recv, commands_send = ctx.Pipe(duplex=False)
        messages_recv, messages_send = ctx.Pipe(duplex=False)
        # Not a daemon: a tensor-parallel engine starts worker processes of its own, which a daemon may not.
        # It still ends with the server: stop() stops it, and a closed pipe (the server gone) ends its loop.
        self._process = ctx.Process(target=run_engine, name="engine",
                                    args=(self.factory, commands_recv, messages_send), daemon=False)
        self._process.start()
        commands_recv.close()
        messages_send.close()
        self._commands, self._messages = commands_send, messages_recv
        deadline = time.monotonic() + timeout_s
        while not messages_recv.poll(0.1):
            if not self._process.is_alive():
                raise RuntimeError(f"the engine process exited with code {self._process.exitcode} while loading")
            if time.monotonic() > deadline:
                self._process.kill()
                raise RuntimeError(f"the engine did not load within {timeout_s:.0f} s")
        message = messages_recv.recv()
        if message[0] == "error":
            self._process.join(timeout=10)
            raise RuntimeError(message[1])
        self.info = message[1]
        return self.info

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start delivering the engine's messages on ``loop``."""
        self._loop = loop
        threading.Thread(target=self._read, name="engine-reader", daemon=True).start()

    def stop(self, timeout_s: float = 30.0) -> None:
        # (no pid: its start failed, fork's EAGAIN at a process limit or ENOMEM; joining it was an AssertionError
        # traceback, "can only join a started process", after the one-line error)
        if self._process is None or self._process.pid is None:
            return
        self._stopping = True
        try:
            if self._commands is not None:  # (None: interrupted while the process started)
                self._commands.send(("stop",))
        except OSError:
            pass
        self._process.join(timeout=timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)

    @property
    def is_alive(self) -> bool:
        return self.error is None and self._process is not None and self._process.is_alive()

    @property
    def stop_reason(self) -> str:
        """Why the engine is not alive: the error it reported, or, where the reader thread's word has not reached the
        event loop yet, the exit code (is_alive reaped the process, so it is known). A health check between the two
        said only "its process exited", without the code that tells a crash (-9, -11) from an exit."""
        if self.error is not None:
            return self.error
        code = None if self._process is None else self._process.exitcode
        return "its process exited" if code is None else f"the engine process exited (code {code})"

    # ---- requests -------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Choices queued but not running: the engine's waiting queue and what is still in the pipe."""
        return self._num_waiting + self._num_submitted - self._num_drained

    def submit(self, prompts: list[list[int]], params: list[SamplingParams]) -> RequestStream:
        if self._closing is not None:
            raise EngineDead("the server is shutting down; it takes no new requests")
        if not self.is_alive:
            raise EngineDead(f"the engine process has stopped: {self.error or 'exited'}")
        if self.num_waiting + len(prompts) > self.max_waiting_requests:
            raise ServerOverloaded(
                f"the server is overloaded: {self.num_waiting} requests are waiting, the limit is "
                f"{self.max_waiting_requests} (--max-waiting-requests); retry later")
        stream = RequestStream(next(self._keys), len(prompts))
        self._streams[stream.key] = stream
        self._num_submitted += len(prompts)
        self._send(("add", stream.key, prompts, params, time.time()))
        return stream

    def abort(self, stream: RequestStream, index: int | None = None, reason: str = "abort",
              num_tokens: int | None = None) -> None:
        """Finish the request's open choices (or only ``index``) and free their blocks at the engine's next step
        boundary; no update follows for them. ``reason`` is what the metrics count them under: "abort" for a client
        that left, "stop" for a choice a stop string ended, after ``num_tokens`` completion tokens: such a choice is
        a finished request in the latency and length metrics too, as in vLLM."""
        if index is not None and index in stream.arrived:
            # The engine finished this choice (max_tokens, eos) in a step the event loop took in before the handler
            # read the update holding the stop string: counted then, and it was counted again here.
            return
        if index is not None and reason == "stop" and num_tokens is not None:
            self._stopped[(stream.key, index)] = num_tokens
        if index is None:
            self._streams.pop(stream.key, None)
            self._aborted[stream.key] = None
        else:
            aborted = self._aborted.setdefault(stream.key, set())
            if aborted is not None:
                aborted.add(index)
        num_aborted = stream.num_unfinished if index is None else 1
        stream.num_unfinished -= num_aborted
        if num_aborted > 0:
            self.metrics.on_aborted(num_aborted, reason)
        if self.is_alive:
            self._send(("abort", stream.key, index))
        else:
            self._aborted.pop(stream.key, None)  # nothing more will come from a dead engine
            self._stopped.pop((stream.key, index), None)

    def end_open_requests(self, reason: str) -> int:
        """End every open request with ``reason`` (finish reason "shutdown") and refuse new ones: the server is shutting
        down and its grace period is over. Each handler then answers its client (a 503, or an error event and
        ``[DONE]``) and aborts what the engine still runs, rather than being cancelled mid-response: a stream was cut
        without an end and a whole request got a plain-text 500, each with a traceback in the log. Returns how many
        requests were open."""
        self._closing = reason
        streams = list(self._streams.values())
        for stream in streams:
            for _ in range(stream.num_open):  # a final update for each choice whose own was not yet read
                stream.queue.put_nowait(Update(stream.key, -1, [], True, "shutdown", reason))
        return len(streams)

    def release(self, stream: RequestStream) -> None:
        """The request is done: stop routing updates to it."""
        self._streams.pop(stream.key, None)

    def _send(self, command: tuple) -> None:
        try:
            self._commands.send(command)
        except OSError as exc:
            self.error = self.error or f"the engine's pipe broke: {exc}"
            raise EngineDead(self.error) from exc

    # ---- the reader thread ----------------------------------------------------------------------
    def _read(self) -> None:
        messages = self._messages
        while True:
            try:
                message = messages.recv()
            except (EOFError, OSError):
                self._wait_for_exit()
                message = ("error", None)  # the exit code is read on the event loop (_on_message)
            try:
                self._loop.call_soon_threadsafe(self._on_message, message)
            except RuntimeError:  # the event loop has closed: the server is shutting down
                return
            if message[0] == "error":
                return

    def _wait_for_exit(self, timeout_s: float = 5.0) -> None:
        """Until the engine process has exited, without reaping it (the event loop does, as is_alive does): its pipe
        closes as it exits, before its exit code is known, and the error said "exited (code None)"."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self._process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return
            except (ChildProcessError, AttributeError):  # reaped already; or no waitid (not POSIX)
                return
            time.sleep(0.01)

    def _counted_at_abort(self, update: Update) -> bool:
        """A finished choice's update that was on its way when the server aborted it (and counted it then)."""
        aborted = self._aborted.get(update.key, ())
        return aborted is None or update.index in aborted

    def _on_stopped(self, key: int, index: int, num_prompt_tokens: int, timing) -> None:
        """The engine's timing of a choice a stop string ended, counted once, cut to the tokens served."""
        num_tokens = self._stopped.pop((key, index), None)
        if num_tokens is not None:
            self.metrics.on_ended_by_stop_string(num_prompt_tokens, timing, num_tokens)

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "step":
            _, self._num_drained, stats, updates = message
            self._num_waiting = stats.num_waiting
            streams = self._streams
            num_generated = 0
            aborted = self._aborted
            for fields in updates:
                update = Update(*fields)
                # Tokens the engine ran on for a choice the server had already ended (a stop string, a client that
                # left) reach nobody: vLLM counts none of them, and each stop string here added a step or more of
                # tokens to vllm:generation_tokens_total beyond what was served.
                if not aborted or not self._counted_at_abort(update):
                    num_generated += len(fields[2])
                stream = streams.get(update.key)
                if update.finished and not self._counted_at_abort(update):
                    self.metrics.on_finished(update)
                    if stream is not None:
                        stream.num_unfinished -= 1
                        stream.arrived.add(update.index)
                elif update.finished and self._stopped:  # a stop string ended it as the engine finished it anyway
                    self._on_stopped(update.key, update.index, update.num_prompt_tokens, update.timing)
                if stream is not None:
                    stream.queue.put_nowait(update)
            self.metrics.on_step(stats, num_generated)
        elif kind == "aborted":  # the engine took the abort in: no update of those choices follows
            key, index = message[1], message[2]
            for ended in message[3] if len(message) > 3 else ():
                self._on_stopped(key, *ended)
            if index is not None:
                self._stopped.pop((key, index), None)  # (its engine update was counted, or there is none)
            aborted = self._aborted.get(key)
            if index is None:
                self._aborted.pop(key, None)
            elif aborted:  # (None: the whole request was aborted since; its own acknowledgement ends it)
                aborted.discard(index)
                if not aborted:
                    del self._aborted[key]
        elif kind == "error":
            reason = message[1] or f"the engine process exited (code {self._process.exitcode})"
            self.error = self.error or reason
            if not self._stopping:
                _log.error("the engine stopped: %s", reason)
            num_failed = 0
            for stream in self._streams.values():
                num_failed += stream.num_unfinished
                stream.num_unfinished = 0
                for _ in range(stream.num_open):
                    stream.queue.put_nowait(Update(stream.key, -1, [], True, "error", self.error))
            self._streams.clear()
            self._stopped.clear()
            # Nothing runs in a stopped engine: its last step's gauges stayed for the server's life
            self.metrics.on_engine_stopped(num_failed)
            if not self._stopping and self.on_engine_death is not None:
                self.on_engine_death(self.error)
