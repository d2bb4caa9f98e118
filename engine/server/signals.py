"""Ctrl-C and SIGTERM for the HTTP server: the first shuts it down gracefully, a second Ctrl-C cuts the open streams,
and neither is raised again after the shutdown. Requests still open when the grace period ends are ended by the app
(``end_requests``): each client gets an answer that says so, not a cut connection.

uvicorn's own handler re-raises every signal it caught once it has shut down. Under ``asyncio.run`` the second of two
Ctrl-Cs then became a KeyboardInterrupt inside the server's cleanup, and uvicorn logged a traceback through its
lifespan task; a SIGTERM re-raised with the default action killed the process before the engine process was stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

import uvicorn

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
FORCED_END_S = 1.0  # after a second Ctrl-C, how long the requests ended at once get to send their answers


class Server(uvicorn.Server):
    """uvicorn's server, with signals that only set ``should_exit`` (then ``force_exit``), as uvicorn's do.

    ``end_requests``, called ``grace_s`` after a shutdown began if requests are still open, ends them in the app: each
    handler answers its client (a 503; a stream an error event and ``[DONE]``) and returns. uvicorn's own timeout
    (``timeout_graceful_shutdown``, set a little longer) cancelled them mid-response instead: a stream was cut without
    an end, a whole request got a plain-text 500, and the log a traceback for each; it stays the last resort.
    """

    def __init__(self, config: uvicorn.Config, *, end_requests: Callable[[], object] | None = None,
                 grace_s: float | None = None) -> None:
        super().__init__(config)
        self.end_requests = end_requests
        self.grace_s = grace_s

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
            yield
            return
        originals = {sig: signal.signal(sig, self.on_signal) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def on_signal(self, signum: int, frame) -> None:
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True  # the second Ctrl-C: requests still open are ended now, not after the grace period
        else:
            self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        ender = None
        if self.end_requests is not None and self.grace_s is not None:
            ender = asyncio.ensure_future(self._end_requests_after_grace())
        try:
            await super().shutdown(sockets)
        finally:
            if ender is not None:
                ender.cancel()
        if self.force_exit:
            # A forced exit waits for nobody, but what is open is still answered (at once): cancelled with the loop, a
            # whole request got a plain-text 500 and the log a traceback for each.
            if self.end_requests is not None and self.server_state.tasks:
                self.end_requests()
                await self._wait_for_requests(FORCED_END_S)
            # uvicorn skips the application's shutdown after a forced exit; the lifespan task (which stops the engine)
            # was then cancelled when the loop closed, and uvicorn logged that as a traceback.
            await self.lifespan.shutdown()

    async def _wait_for_requests(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def _end_requests_after_grace(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.1)
        if self.server_state.tasks and not self.force_exit:  # (a forced exit cuts them, as asked)
            self.end_requests()
