"""A request-body size limit, enforced before the body is read whole (an ASGI middleware under FastAPI).

FastAPI reads a whole body into memory and parses it in the event loop before a route sees it: a multi-GB body was
read into memory, and 200,000 chat messages (6.8 MB) held /health and every stream for 1.8 s. Neither uvicorn nor
FastAPI has a limit of their own. A body that declares more than the limit (Content-Length) is answered 413 before
any of it is read; a chunked one is counted as it arrives and answered 413 as soon as it passes the limit.
"""

from __future__ import annotations

# Far above any legitimate request: the API takes text and token ids only (no images), and a prompt beyond
# max_model_len is refused anyway; 128k tokens are ~0.5 MB of text, ~1 MB as token ids. 32 MiB still admits a batch of
# hundreds of long prompts in one /v1/completions request (nginx's default of 1 MiB would refuse such batches; uvicorn
# and FastAPI set no limit). It bounds memory, and the time one body holds the event loop: 32 MiB of one-character chat
# messages take ~5 s to parse, 32 MiB of token ids ~0.5 s. A server facing untrusted clients can set less.
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 2**20
OPTION = "--max-request-body-bytes"


class RequestBodyLimit:
    """Answers 413 to a body over ``max_body_bytes``; a body within it reaches ``app`` as one message."""

    def __init__(self, app, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared_bytes = _content_length_bytes(scope)
        if declared_bytes is not None and declared_bytes > self.max_body_bytes:
            await self._too_large(scope, send, str(declared_bytes))
            return
        body = await self._read_within_limit(receive)
        if body is None:
            await self._too_large(scope, send, f"more than {self.max_body_bytes}")
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

    async def _read_within_limit(self, receive):
        """The whole body; None once it passes the limit (the rest is never read); _DISCONNECTED if the client
        left. Counted as it arrives, since a chunked body declares no length."""
        chunks, received_bytes = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return _DISCONNECTED
            chunk = message.get("body", b"")
            received_bytes += len(chunk)
            if received_bytes > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, scope, send, size: str) -> None:
        # Imported here: cli.engine_serve reads the default before it checks that fastapi is installed.
        from fastapi.responses import JSONResponse

        from engine.server.protocol import APIError

        error = APIError(413, f"the request body has {size} bytes; this server accepts at most {self.max_body_bytes} "
                              f"({OPTION})")
        # The unread rest of the body cannot be skipped on this connection: it is closed, and the answer says so.
        response = JSONResponse(error.body(), status_code=413, headers={"Connection": "close"})
        await response(scope, _no_receive, send)


_DISCONNECTED = object()


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
