"""A request-body size limit, enforced before the body is read whole (an ASGI middleware under FastAPI).

FastAPI reads a whole body into memory and parses it in the event loop before a route sees it: a multi-GB body was
read into memory, and 200,000 chat messages (6.8 MB) held /health and every stream for 1.8 s. Neither uvicorn nor
FastAPI has a limit of their own. A body that declares more than the limit (Content-Length) is answered 413 without
being kept; a chunked one is counted as it arrives and answered 413 once it passes the limit.

What the client still sends of a refused body is read and dropped before the answer (up to ``DRAIN_MAX_BYTES``, while
it keeps coming): a client that writes its whole request before it reads (httpx, and so the openai SDK) lost the 413
otherwise. The server closed the connection with the body's rest unread, which resets it, and the reset can discard
the answer still on its way: "peer closed connection without sending complete message body". A client that sent
``Expect: 100-continue`` has sent nothing yet and gets its answer at once, as does one declaring more than that cap.

A server that shuts down ends the reads still waiting on a body (``BodyReads.end``): each such client is answered 503.
"""

from __future__ import annotations

import asyncio

# Far above any legitimate request: the API takes text and token ids only (no images), and a prompt beyond
# max_model_len is refused anyway; 128k tokens are ~0.5 MB of text, ~1 MB as token ids. 32 MiB still admits a batch of
# hundreds of long prompts in one /v1/completions request (nginx's default of 1 MiB would refuse such batches; uvicorn
# and FastAPI set no limit). It bounds memory, and the time one body holds the event loop: 32 MiB of one-character chat
# messages take ~5 s to parse, 32 MiB of token ids ~0.5 s. A server facing untrusted clients can set less.
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 2**20
OPTION = "--max-request-body-bytes"
# Reading a refused body's rest to the end costs no memory (nothing is kept), only the time it takes to arrive: ten
# times the default limit is far beyond any batch sent by mistake, and a second on a 2 Gbit/s link. A larger one is
# answered unread, and its client may see a reset instead of the 413.
DRAIN_MAX_BYTES = 320 * 2**20
DRAIN_IDLE_S = 1.0  # a client that stops sending for this long is answered (a chunked body may never end)
DRAIN_MAX_S = 30.0


class BodyReads:
    """The requests whose body is still arriving, which a server that shuts down ends (``end``) as it ends those in the
    engine: a client that sent its body slowly, or only its headers, held the shutdown to uvicorn's last resort
    (engine.server.signals), seconds after the grace period, and was then cut with a plain-text 500 and a traceback in
    the log. Each is answered 503 with the reason, as a request in the engine is."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.reason: str | None = None

    def end(self, reason: str) -> int:
        """Stop every read still waiting (their requests answer 503 with ``reason``); returns how many there were."""
        self.reason = reason
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)


class RequestBodyLimit:
    """Answers 413 to a body over ``max_body_bytes``; a body within it reaches ``app`` as one message. ``reads``: where
    the reads under way are kept, for a shutdown to end them."""

    def __init__(self, app, max_body_bytes: int, reads: BodyReads | None = None) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.reads = reads

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task() if self.reads is not None else None
        if task is not None:
            self.reads.tasks.add(task)
        try:
            body = await self._read(scope, receive)
        except asyncio.CancelledError:
            if task is None or self.reads.reason is None:  # not ended by the shutdown: uvicorn's own cancel
                raise
            uncancel = getattr(task, "uncancel", None)  # (Python 3.11+: else the task, which goes on to answer, stays
            if uncancel is not None:                     # marked as being cancelled)
                uncancel()
            from engine.server.protocol import APIError  # (here, as in _too_large)

            await self._answer(scope, send, APIError(503, self.reads.reason))
            return
        finally:
            if task is not None:
                self.reads.tasks.discard(task)
        if isinstance(body, _TooLarge):
            await self._too_large(scope, send, body.size)
            return
        if body is _DISCONNECTED:
            return
        replayed = False

        async def replay():  # the body once, then the connection's own messages (a disconnect, for a long request)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, scope, receive):
        """The whole body; a _TooLarge once a body over the limit is drained; _DISCONNECTED if the client left."""
        declared_bytes = _content_length_bytes(scope)
        if declared_bytes is not None and declared_bytes > self.max_body_bytes:
            if declared_bytes <= DRAIN_MAX_BYTES and not _expects_continue(scope):
                await _drain(receive, 0, declared_bytes)
            return _TooLarge(str(declared_bytes))
        body = await self._read_within_limit(receive)
        if isinstance(body, _Overflow):
            if body.more_body:
                await _drain(receive, body.received_bytes, None)
            return _TooLarge(f"more than {self.max_body_bytes}")
        return body

    async def _read_within_limit(self, receive):
        """The whole body; an _Overflow once it passes the limit (what came is dropped); _DISCONNECTED if the client
        left. Counted as it arrives, since a chunked body declares no length."""
        chunks, received_bytes = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk = message.get("body", b"")
            received_bytes += len(chunk)
            if received_bytes > self.max_body_bytes:
                return _Overflow(received_bytes, message.get("more_body", False))
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, scope, send, size: str) -> None:
        # Imported here: cli.engine_serve reads the default before it checks that fastapi is installed.
        from engine.server.protocol import APIError

        await self._answer(scope, send, APIError(413, f"the request body has {size} bytes; this server accepts at "
                                                      f"most {self.max_body_bytes} ({OPTION})"))

    @staticmethod
    async def _answer(scope, send, error) -> None:
        from fastapi.responses import JSONResponse

        # The unread rest of the body cannot be skipped on this connection: it is closed, and the answer says so.
        response = JSONResponse(error.body(), status_code=error.status, headers={"Connection": "close"})
        await response(scope, _no_receive, send)


_DISCONNECTED = object()


class _TooLarge:
    """A body over the limit, of ``size`` bytes (as the 413 says it)."""

    def __init__(self, size: str) -> None:
        self.size = size


class _Overflow:
    """A body that passed the limit: the bytes received so far, and whether more is on its way."""

    def __init__(self, received_bytes: int, more_body: bool) -> None:
        self.received_bytes = received_bytes
        self.more_body = more_body


async def _drain(receive, received_bytes: int, declared_bytes: int | None) -> None:
    """Read and drop the rest of a refused body (the module's docstring says why): until it ends, the client leaves
    or stops sending for DRAIN_IDLE_S, or DRAIN_MAX_BYTES or DRAIN_MAX_S are reached."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_MAX_S
    while received_bytes < DRAIN_MAX_BYTES and (declared_bytes is None or received_bytes < declared_bytes):
        timeout = min(DRAIN_IDLE_S, deadline - loop.time())
        if timeout <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), timeout)
        except asyncio.TimeoutError:
            return
        if message["type"] == "http.disconnect":
            return
        received_bytes += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _expects_continue(scope) -> bool:
    """The client waits for a "100 Continue" before it sends the body; reading would ask for the body."""
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope.get("headers", ()))


async def _no_receive():  # a JSONResponse does not read; it must never get here
    raise RuntimeError("a 413 response read the request")


def _content_length_bytes(scope) -> int | None:
    """The declared body length; None without one (chunked) or when unreadable (the server refuses those)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
