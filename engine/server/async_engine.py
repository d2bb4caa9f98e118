"""One engine loop in a thread, fed by the HTTP server's event loop (torch-free).

The step loop (``LLMEngine.step``) runs on its own thread and is the only code that touches the
scheduler, the block manager and the runner: requests and aborts reach it as commands drained at
each step boundary, so a request joins the very next step after it arrives and nothing holds a lock
around generation. What a step produced goes back to the event loop in one ``call_soon_threadsafe``
per step, as per-request updates pushed onto each HTTP request's queue.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence

_log = logging.getLogger(__name__)

# The step log is the engine's record of every step; a server runs for days, so it is dropped this often
# (the figures a server reports come from its metrics, not from the step log).
STEP_LOG_MAX_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class Update:
    """New output of one sequence after a step: ``index`` is its choice in the HTTP request."""

    index: int
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass(eq=False)
class RequestStream:
    """The engine's sequences for one HTTP request and the queue their updates arrive on."""

    queue: asyncio.Queue
    seqs: list[Sequence] = field(default_factory=list)
    num_sent: list[int] = field(default_factory=list)
    num_open: int = 0

    async def updates(self, is_alive: Callable[[], bool]):
        """Every update until each of the request's sequences has finished. Should the engine loop die with
        an update never posted, the wait ends within a second with an error for what is still open."""
        queue = self.queue
        while self.num_open:
            if queue.empty():
                try:
                    update = await asyncio.wait_for(queue.get(), timeout=1.0)
                except asyncio.TimeoutError:
                    if not is_alive():
                        for _ in range(self.num_open):
                            yield Update(-1, [], True, "error", "the engine loop stopped")
                        return
                    continue
            else:
                update = queue.get_nowait()
            if update.finished:
                self.num_open -= 1
            yield update


@dataclass(frozen=True, slots=True)
class _Add:
    stream: RequestStream
    prompts: list[list[int]]
    params: list[SamplingParams]
    request_id: str
    arrival_s: float


@dataclass(frozen=True, slots=True)
class _Abort:
    stream: RequestStream
    index: int | None


class ServerOverloaded(Exception):
    """The waiting queue is at its limit."""


class AsyncEngine:
    """Owns the step-loop thread. ``submit`` and ``abort`` are called from the event loop only."""

    def __init__(self, engine: LLMEngine, *, max_waiting_requests: int,
                 on_step: Callable[[object, list[Sequence], int], None] | None = None,
                 on_abort: Callable[[Sequence], None] | None = None) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._on_step = on_step  # (batch, finished sequences, tokens sampled), after each step
        self._on_abort = on_abort  # each sequence aborted for a client
        self._commands: deque[Callable[[], None]] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[int, tuple[RequestStream, int]] = {}  # seq_id -> (its stream, its choice index)
        # Sequences submitted (counted by the event loop) and drained into the scheduler (by the engine
        # thread): each counter has one writer, so their difference needs no lock.
        self._num_submitted = 0
        self._num_drained = 0
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None  # what stopped the loop, if anything did

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ---- called from the event loop --------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Requests queued but not running: the scheduler's waiting queue and submissions not yet drained.
        Read across threads: a deque's length is one atomic read, and an estimate is all admission needs."""
        return len(self.engine.scheduler.waiting) + self._num_submitted - self._num_drained

    def submit(self, prompts: list[list[int]], params: list[SamplingParams], request_id: str) -> RequestStream:
        """Queue one HTTP request's sequences (choices) for the next step."""
        if self.num_waiting + len(prompts) > self.max_waiting_requests:
            raise ServerOverloaded(
                f"the server is overloaded: {self.num_waiting} requests are waiting, the limit is "
                f"{self.max_waiting_requests} (--max-waiting-requests); retry later")
        stream = RequestStream(asyncio.Queue(), num_open=len(prompts))
        self._num_submitted += len(prompts)
        self._command(_Add(stream, prompts, params, request_id, self.engine.clock.now()))
        return stream

    def abort(self, stream: RequestStream, index: int | None = None) -> None:
        """Finish the request's unfinished sequences (or only choice ``index``) and free their blocks at the next
        step boundary (a client went away, or a stop string ended a choice). No update follows for them."""
        if self.is_alive:
            self._command(_Abort(stream, index))

    def _command(self, command: _Add | _Abort) -> None:
        if not self.is_alive:
            raise RuntimeError(f"the engine loop has stopped: {self.error!r}")
        self._commands.append(command)
        self._wake.set()

    # ---- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        commands = self._commands
        try:
            while not self._stopping:
                while commands:
                    command = commands.popleft()
                    if isinstance(command, _Add):
                        self._add(command)
                    else:
                        self._abort(command.stream, command.index)
                if not engine.has_unfinished_requests():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                batch, finished = engine.step()
                num_generated = self._publish(batch)
                if self._on_step is not None:
                    self._on_step(batch, finished, num_generated)
                if len(engine.step_log) >= STEP_LOG_MAX_ROWS:
                    engine.step_log.clear()
        except BaseException as exc:  # noqa: BLE001 - the loop must report why it stopped, whatever it was
            _log.exception("the engine loop stopped")
            self.error = exc
            self._fail_all(f"the engine loop stopped: {type(exc).__name__}: {exc}")

    def _add(self, add: _Add) -> None:
        self._num_drained += len(add.prompts)
        stream = add.stream
        for index, (ids, sp) in enumerate(zip(add.prompts, add.params)):
            seq = self.engine.add_request(ids, sp, request_id=f"{add.request_id}-{index}", arrival_s=add.arrival_s)
            stream.seqs.append(seq)
            stream.num_sent.append(0)
            if seq.is_finished:  # rejected: the server checks lengths first, so this is a limit it missed
                self._post([(stream, Update(index, [], True, seq.finish_reason.value, seq.reject_reason,
                                            seq.num_prompt_tokens))])
            else:
                self._streams[seq.seq_id] = (stream, index)

    def _abort(self, stream: RequestStream, index: int | None) -> None:
        for seq in stream.seqs if index is None else stream.seqs[index:index + 1]:
            self._streams.pop(seq.seq_id, None)
            if not seq.is_finished:
                self.engine.abort_request(seq)
                if self._on_abort is not None:
                    self._on_abort(seq)

    def _publish(self, batch) -> int:
        """Post each tracked sequence's new tokens; returns how many tokens the step sampled."""
        updates = []
        num_generated = 0
        streams = self._streams
        for seq in batch.seqs:
            entry = streams.get(seq.seq_id)
            if entry is None:
                continue
            stream, index = entry
            produced = seq.num_completion_tokens
            sent = stream.num_sent[index]
            finished = seq.is_finished
            if produced == sent and not finished:
                continue  # a prompt chunk: nothing sampled yet
            stream.num_sent[index] = produced
            new = seq.token_ids[seq.num_prompt_tokens + sent:]
            num_generated += len(new)
            if finished:
                del streams[seq.seq_id]
                reason = seq.finish_reason.value if seq.finish_reason is not None else None
                updates.append((stream, Update(index, new, True, reason, seq.error, seq.num_prompt_tokens,
                                               seq.num_cached_tokens)))
            else:
                updates.append((stream, Update(index, new, False)))
        if updates:
            self._post(updates)
        return num_generated

    def _post(self, updates: list) -> None:
        self._loop.call_soon_threadsafe(_deliver, updates)

    def _fail_all(self, message: str) -> None:
        """Finish every open request with the error, those still queued as commands too."""
        updates = [(stream, Update(index, [], True, "error", message)) for stream, index in self._streams.values()]
        self._streams.clear()
        while self._commands:
            command = self._commands.popleft()
            if isinstance(command, _Add):
                updates.extend((command.stream, Update(i, [], True, "error", message))
                               for i in range(len(command.prompts)))
        if updates and self._loop is not None and not self._loop.is_closed():
            self._post(updates)


def _deliver(updates: list) -> None:
    for stream, update in updates:
        stream.queue.put_nowait(update)
