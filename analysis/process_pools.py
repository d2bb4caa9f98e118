"""Local process pools that Ctrl-C stops cleanly: the capacity sweep's (`analysis.capacity.executors`) and the
prediction bands' (`analysis.bands`).

Python raises KeyboardInterrupt in the main thread at whatever line it has reached, and the code of
`concurrent.futures` is not written to be cut anywhere (`interrupts_held`). Cut inside ``wait`` (which takes every
future's lock in turn), the sweep kept one of those locks; the pool's thread, failing the futures as the interrupted
sweep stopped its workers, then waited for that lock forever, and so did the interpreter's exit, which joins that
thread: the command printed its one line and hung. Cut inside ``submit`` while it started a worker, the worker died
on its half-written start-up data ("pickle data was truncated", a traceback of its own) or started unknown to the
pool. Stopping a pool has its own races (`stop_pool`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor

from engine.core.interrupt import end_with_parent

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


def spawn_pool(max_workers: int, initializer: Callable, initargs: tuple) -> ProcessPoolExecutor:
    """A pool of spawned processes (not forked: polars and pyarrow keep thread pools that a forked child can inherit
    in a locked state), whose workers start when work is submitted: do that inside ``interrupts_held(block_sigint=
    True)``, and have ``initializer`` ignore SIGINT and then unblock it."""
    import multiprocessing
    from multiprocessing import resource_tracker

    pool = ProcessPoolExecutor(max_workers=max_workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(initializer, initargs))
    if os.name == "posix":  # started now, before any worker: started from a submit, it unblocks SIGINT there
        resource_tracker.ensure_running()
    return pool


def _start_worker(initializer: Callable, initargs: tuple) -> None:
    """A worker's start: it ends with the process that started the pool (``end_with_parent``; spawned from the main
    thread, in ``submit``, as the kernel's parent-death signal needs), then runs the pool's own ``initializer``."""
    end_with_parent()
    initializer(*initargs)


def stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the running work and cancel the queued work, now. Waiting for the running work would take as long as it
    does and the pool has no public way to stop it, so its processes are terminated directly (the workers go first:
    one still starting would otherwise find the pool's queues gone and print a traceback). The pool's own thread then
    notices them gone, fails what is left as broken and closes the pool's pipes: it is waited for. Left to run, it
    could close its wake-up pipe while the interpreter exited, and Python 3.11's exit hook for pools (which writes to
    that pipe without the pool's lock) printed "OSError: [Errno 9] Bad file descriptor" under the interrupt's one
    line; once the thread is done the hook finds the pipe closed and leaves it alone. On Python 3.11 that thread also
    reports an InvalidStateError for each future cancelled meanwhile (``map`` cancels what is left when its loop is
    interrupted): that one is not shown."""
    from concurrent.futures import InvalidStateError

    manager = getattr(pool, "_executor_manager_thread", None)
    processes = list((getattr(pool, "_processes", None) or {}).values())
    shown = threading.excepthook

    def quiet(args) -> None:
        if not (args.thread is manager and issubclass(args.exc_type, InvalidStateError)):
            shown(args)

    threading.excepthook = quiet
    try:
        with interrupts_held():
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=1.0)
                if process.exitcode is None:
                    process.kill()
                    process.join(timeout=1.0)
            pool.shutdown(wait=False, cancel_futures=True)
            if manager is not None:
                manager.join(timeout=5.0)
    finally:
        threading.excepthook = shown


def write_start_up_file(data: object, prefix: str) -> str:
    """``data`` pickled to a new temporary file, whose path a pool's workers get as start-up data instead of ``data``
    itself (``read_start_up_file``): megabytes of start-up data go down the pipe to each new worker, which kept the
    pool waiting until the worker had imported its modules, and forever where a signal killed the worker meanwhile.
    The caller removes the file (``remove_start_up_file``) once the pool is done."""
    descriptor, path = tempfile.mkstemp(prefix=prefix, suffix=".pickle")
    try:
        with os.fdopen(descriptor, "wb") as file:
            pickle.dump(data, file, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # (a full disk, Ctrl-C): no file left behind
        remove_start_up_file(path)
        raise
    return path


def read_start_up_file(path: str) -> object:
    with open(path, "rb") as file:
        return pickle.load(file)


def remove_start_up_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
