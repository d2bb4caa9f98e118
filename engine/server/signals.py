"""Ctrl-C and SIGTERM for the HTTP server: the first shuts it down gracefully, a second Ctrl-C cuts the open streams,
and neither is raised again after the shutdown.

uvicorn's own handler re-raises every signal it caught once it has shut down. Under ``asyncio.run`` the second of two
Ctrl-Cs then became a KeyboardInterrupt inside the server's cleanup, and uvicorn logged a traceback through its
lifespan task; a SIGTERM re-raised with the default action killed the process before the engine process was stopped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Server(uvicorn.Server):
    """uvicorn's server, with signals that only set ``should_exit`` (then ``force_exit``), as uvicorn's do."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():  # signals reach only the main thread
            yield
            return
        originals = {sig: signal.signal(sig, self._on_signal) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True  # the second Ctrl-C: streams still open are cut now, not after the grace period
        else:
            self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets)
        if self.force_exit:
            # uvicorn skips the application's shutdown after a forced exit; the lifespan task (which stops the engine)
            # was then cancelled when the loop closed, and uvicorn logged that as a traceback.
            await self.lifespan.shutdown()
