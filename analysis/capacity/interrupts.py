"""Ctrl-C during a sweep acts between the pool's steps, never inside one (`interrupts_held`).

Python raises KeyboardInterrupt in the main thread at whatever line it has reached, and the code of
`concurrent.futures` is not written to be cut anywhere. Cut inside ``wait`` (which takes every future's lock in
turn), the sweep kept one of those locks; the pool's thread, failing the futures as the interrupted sweep stopped
its workers, then waited for that lock forever, and so did the interpreter's exit, which joins that thread: the
command printed its one line and hung. Cut inside ``submit`` while it started a worker, the worker died on its
half-written start-up data ("pickle data was truncated", a traceback of its own) or started unknown to the pool.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGTERM too: the commands turn it into a KeyboardInterrupt


@contextlib.contextmanager
def interrupts_held(block_sigint: bool = False) -> Iterator[None]:
    """Hold Ctrl-C (and SIGTERM) off the code in the block: a signal that arrives meanwhile is acted on when the
    block ends, by the handler that was in place (so KeyboardInterrupt is raised there, and only there).

    `block_sigint`: also block SIGINT in this thread meanwhile. A process started in the block inherits the mask,
    so a terminal's Ctrl-C, which reaches every process of the group, cannot interrupt it while it imports (it
    should ignore SIGINT once started). A handler as well as the mask: another thread of this process may take the
    signal. Only in the main thread, where Python runs signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda number, frame: received.append(number))
                for signum in HELD_SIGNALS if signal.getsignal(signum) is not None}  # None: set outside Python
    masked = None
    if block_sigint and hasattr(signal, "pthread_sigmask"):
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if masked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)  # a Ctrl-C the mask held reaches `received` now
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _deliver(dict.fromkeys(received), previous)


def _deliver(signums: Iterable[int], handlers: Mapping) -> None:
    """Act on the signals held back, each once, in the order they came, as their handlers would have; the first
    exception a handler raises (KeyboardInterrupt) is raised once all have run (SIGTERM's records that it came)."""
    raised: BaseException | None = None
    for signum in signums:
        handler = handlers[signum]
        try:
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)
        except BaseException as exc:
            raised = raised or exc
    if raised is not None:
        raise raised
