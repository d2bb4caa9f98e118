"""Ctrl-C at a command line: exit status 130 and one line on stderr, never a KeyboardInterrupt traceback.

Every command writes its outputs beside their targets and renames them into place when complete, so an
interrupted command leaves no partial file; the line says what is left, which each command knows.
SIGTERM (what ``timeout`` and most supervisors send) is handled the same way, with status 143: by default
it killed the process at once and left its hidden staging folder (``.OUT.partial-PID``) behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import importlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from engine.core.messages import long_name_message

T = TypeVar("T")

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_BAD_INPUT = 2  # every command's status for an input or option it cannot use

NOTHING_WRITTEN = "interrupted: nothing written"
EACH_FILE_WHOLE = "interrupted: files finished before it are written, none in part"


class InterruptedOnceWritten(KeyboardInterrupt):
    """A Ctrl-C (or SIGTERM) that came once a command's outputs were in place, whole; ``str()`` is its line. The
    commands' own lines said nothing was written, then: analysis.compare, traces.synth and the others printed
    "interrupted: nothing written" over a complete output (a rerun met "exists; pass --overwrite"), and
    sim.calibrate said so of a profile it had already rewritten."""

    def __init__(self, done: str) -> None:  # ``done``: what is in place ("the outputs in OUT/ are complete")
        super().__init__(f"interrupted: {done}; only this summary was cut")


@contextlib.contextmanager
def outputs_in_place(done: str) -> Iterator[None]:
    """Around what a command does once its outputs are written (the lines it prints about them): a Ctrl-C or SIGTERM
    there ends it with the line "interrupted: ``done``; only this summary was cut" and the usual status."""
    try:
        yield
        sys.stdout.flush()  # the lines reach their reader here, not in the command's wrapper after main returned
    except KeyboardInterrupt:
        raise InterruptedOnceWritten(done) from None


class _Terminated:
    """Whether SIGTERM arrived during the current main (a flag the handler sets)."""

    received = False


def _unwinding_an_interrupt() -> bool:
    """Whether the code a signal handler cut into is an ``except`` or ``finally`` (a with-block's exit) run because of
    a KeyboardInterrupt: the interrupt is being acted on, and a second one raised there would cut that short."""
    return isinstance(sys.exc_info()[1], KeyboardInterrupt)


def _on_sigint(signum, frame) -> None:
    """Python's own Ctrl-C handler (``signal.default_int_handler``), but for one that comes while a KeyboardInterrupt
    is already being acted on: that one is dropped. Polars puts a SIGINT hook of its own in front of Python's when it
    is imported, and a Ctrl-C during one of its queries became two KeyboardInterrupts: the query's own, then Python's
    at the first line the unwinding ran. That line was in the ``finally`` that removes a staging folder (left behind)
    or in the ``except`` that prints the one line (a traceback and status -2 instead, seen once in CI). A second
    Ctrl-C typed meanwhile cut the clean-up the same way."""
    if not _unwinding_an_interrupt():
        raise KeyboardInterrupt


def _on_sigterm(signum, frame) -> None:
    _Terminated.received = True
    if not _unwinding_an_interrupt():  # (the status becomes 143 all the same)
        raise KeyboardInterrupt  # unwinds like Ctrl-C: staging folders are removed, pools are stopped


def _take_sigint() -> Callable | None:
    """Put ``_on_sigint`` in place of Python's handler (or of the package's until-main one) while a command's main
    runs; what was there, to put back, or None where nothing changed (another handler, or not the main thread)."""
    current = signal.getsignal(signal.SIGINT)
    if current not in (signal.default_int_handler, _interrupted_before_main, _exit_at_once):
        return None
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        return None
    # After main the package's until-main handler has no more use: Python's stands in for it
    return signal.default_int_handler if current in (_interrupted_before_main, _exit_at_once) else current


def _give_back_sigint(previous: Callable | None) -> None:
    if previous is not None and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, previous)


def _print_any_path() -> None:
    """A file name may hold bytes that are not UTF-8 (Python gives them as \\udcff escapes); a command prints the
    paths it reads and writes, and under a UTF-8 locale (strict) that print raised UnicodeEncodeError after the
    work was done. Such characters are printed as their escapes instead (a C locale's surrogateescape is kept)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


class _ReaderGoneSafe:
    """A command's stdout or stderr whose writes go to /dev/null once its reader has gone (``python -m sim.replay
    TRACE | head``): the command carries on to its end with its status, its files being its outputs, where a
    BrokenPipeError traceback ended it (status 1) between the outputs and the lines about them.

    stderr carries progress bars and the lines about the run: one that cannot be written at all (``2>/dev/full``, a
    descriptor closed or opened read-only) is discarded in the same way; the progress bar's first write failed and
    the run stopped with status 2 (1 where Python had no stderr), its outputs thrown away, for want of a progress
    bar. A stdout that cannot be written (``>/dev/full``) is discarded too, and remembered (``lost``): the command
    still ends its work, then says so in one line with status 2, where the OSError was a traceback with status 1."""

    def __init__(self, stream, name: str) -> None:
        self._stream = stream
        self._name = name
        self.lost: OSError | None = None  # stdout's first failed write, other than a gone reader

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)
        except KeyboardInterrupt:
            self._cut()
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)
        except KeyboardInterrupt:
            self._cut()
            raise

    def _cut(self) -> None:
        """A Ctrl-C (or SIGTERM) that came while stdout was written, most often blocked on a reader that has stopped
        reading (``| less`` left waiting, a stalled terminal or link): what it still holds goes to /dev/null. Each
        flush after the interrupt blocked again on that reader: the command hung after its line, a second Ctrl-C was
        a KeyboardInterrupt traceback, and the interpreter's last flush at exit then ignored Ctrl-C and SIGTERM."""
        if self._name == "stdout":  # stderr is where the interrupt's line goes
            self._discard()

    def _failed(self, exc: OSError) -> None:
        gone = isinstance(exc, BrokenPipeError) or exc.errno == errno.EBADF  # no reader, or no stream at all
        if not gone and self._name == "stdout" and self.lost is None:
            self.lost = exc
        self._discard()

    def _discard(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())  # what the stream still buffers is written there too
        finally:
            os.close(devnull)
        try:
            self._stream.flush()  # what it buffers goes there now, not again to the failing file on the next write
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _guard_against_a_gone_reader() -> tuple:
    """Put ``_ReaderGoneSafe`` around sys.stdout and sys.stderr where they are files, and /dev/null where Python has
    none (the descriptor was closed when it started: ``2>&-``, on which a progress bar's write raised AttributeError);
    returns what they were."""
    was = (sys.stdout, sys.stderr)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w"))  # noqa: SIM115 -- closed by _end_guard
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # a stream in memory (a test's capture)
            continue
        if not isinstance(stream, _ReaderGoneSafe):
            setattr(sys, name, _ReaderGoneSafe(stream, name))
    return was


@contextlib.contextmanager
def reader_gone_safe() -> Iterator[None]:
    """``_ReaderGoneSafe`` around sys.stdout and sys.stderr, for a command that handles its signals itself rather
    than through exit_130_on_interrupt (engine.serve): its lines to a reader that has gone are discarded."""
    streams = _guard_against_a_gone_reader()
    try:
        yield
    finally:
        _end_guard(streams)


def _stdout_lost() -> OSError | None:
    """Flush the guarded stdout; the error of its first write that failed for another reason than a gone reader."""
    stream = sys.stdout
    if not isinstance(stream, _ReaderGoneSafe):
        return None
    stream.flush()
    return stream.lost


def _exit_2_if_stdout_lost(status: object) -> None:
    """Once main has returned ``status``: a stdout whose writes failed (other than for a gone reader) turns a success
    into one line and status 2, since what the command printed there is incomplete."""
    lost = _stdout_lost()
    if lost is not None and status in (None, 0):
        print(f"error: cannot write to standard output ({lost.strerror or lost}); what the command printed there "
              "is incomplete", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _end_guard(was: tuple) -> None:
    """Flush what main printed through the guard (a reader gone then is no error at exit, which Python reports with
    status 120), then put the streams back."""
    for stream, previous in zip((sys.stdout, sys.stderr), was):
        if isinstance(stream, _ReaderGoneSafe):
            stream.flush()
        elif previous is None and getattr(stream, "name", None) == os.devnull:  # ours, in place of none
            stream.close()
    sys.stdout, sys.stderr = was


def _interrupted_before_main(signum, frame) -> None:
    print(NOTHING_WRITTEN, file=sys.stderr)
    # Left in place, this handler took a second signal during the exit handlers (certifi's, torch's): the line again
    # and an 'Exception ignored in atexit callback' traceback of its SystemExit.
    _shutting_down_after_interrupt()
    raise SystemExit(128 + signum)  # unwinds the imports quietly: no traceback


def _exit_at_once(signum, frame) -> None:
    """Ctrl-C (or SIGTERM) again while an interrupted command shuts down: leave now, with the status already
    decided. Torch's and multiprocessing's exit handlers run after main, and a second Ctrl-C there printed
    'Exception ignored in atexit callback' and a KeyboardInterrupt traceback under the one line."""
    sys.stderr.flush()
    os._exit(EXIT_TERMINATED if _Terminated.received else EXIT_INTERRUPTED)


def _shutting_down_after_interrupt() -> None:
    """From here on the process only exits: a further Ctrl-C or SIGTERM ends it at once, quietly. Each file a
    command writes is renamed into place whole, and its staging files were removed as the interrupt unwound main."""
    try:
        signal.signal(signal.SIGINT, _exit_at_once)
        signal.signal(signal.SIGTERM, _exit_at_once)
    except ValueError:  # not the main thread
        pass


def quiet_until_main() -> None:
    """Called by a package whose modules are commands (traces, analysis) as ``python -m PACKAGE.COMMAND`` imports it:
    until the command's ``main`` (decorated below) starts, Ctrl-C or SIGTERM print the one line and exit 130 (143).
    The package imports numpy and polars first (half a second), and a Ctrl-C then was a KeyboardInterrupt traceback
    through importlib. runpy sets ``sys.argv[0]`` to '-m' while it imports the packages on the way to the command, so
    an ordinary import of the package changes nothing."""
    if sys.argv[:1] != ["-m"]:
        return
    try:
        signal.signal(signal.SIGINT, _interrupted_before_main)
        signal.signal(signal.SIGTERM, _interrupted_before_main)
    except ValueError:  # not the main thread
        pass


def _exit_on_long_name(exc: OSError) -> None:
    """One line and status 2 for ``exc``, an OSError of a path with a name past the file system's limit."""
    print(f"error: {long_name_message(exc)}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT) from None


def one_line_script_errors(main: Callable) -> Callable:
    """Decorate the ``main`` of a script run as a file (benchmarks/, validation/), which has none of
    ``exit_130_on_interrupt``'s handling: a path with a name past the file system's limit (an input folder, a trace,
    --shared, --results) was an OSError traceback at the first Path.exists() or is_file() that met it, status 1; it
    is one line and status 2, as in the commands. Ctrl-C was a KeyboardInterrupt traceback through whatever the
    script was running (a bisection's simulation, a GPU run), status -2; it is one line and status 130. The scripts
    write their files at their end, each renamed into place whole where it is a result. Their stdout and stderr are
    guarded as the commands' are (``_ReaderGoneSafe``): ``python validation/step_errors.py RUN | head`` was a
    BrokenPipeError traceback and status 1 once head had its lines, before the files a script writes after its table
    (--json); a stdout that cannot be written at all (``>/dev/full``) is one line and status 2 after the work."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        previous = _take_sigint()
        streams = _guard_against_a_gone_reader()
        try:
            status = main(*args, **kwargs)
            _exit_2_if_stdout_lost(status)
            return status
        except KeyboardInterrupt:
            print(EACH_FILE_WHOLE, file=sys.stderr)
            raise SystemExit(EXIT_INTERRUPTED) from None
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            _exit_on_long_name(exc)
        finally:
            _give_back_sigint(previous)
            _end_guard(streams)

    return wrapped


def exit_130_on_interrupt(message: str = NOTHING_WRITTEN) -> Callable:
    """Decorate a ``main(argv)``: on KeyboardInterrupt print ``message`` (an InterruptedOnceWritten's own line) and
    exit with status 130 (143 for SIGTERM, which is turned into a KeyboardInterrupt while ``main`` runs). A main that
    handles the interrupt itself and exits 130 keeps its own message; after SIGTERM its status becomes 143."""

    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapped(*args, **kwargs):
            _Terminated.received = False
            _print_any_path()
            previous_sigint = _take_sigint()  # main handles Ctrl-C now
            try:
                previous = signal.signal(signal.SIGTERM, _on_sigterm)
            except ValueError:  # not the main thread: leave signals alone
                previous = None
            interrupted = False
            streams = _guard_against_a_gone_reader()
            try:
                status = main(*args, **kwargs)
                _exit_2_if_stdout_lost(status)
                return status
            except KeyboardInterrupt as exc:
                interrupted = True
                line = str(exc) if isinstance(exc, InterruptedOnceWritten) else message
                print(f"\n{line}" if sys.stderr.isatty() else line, file=sys.stderr)
                raise SystemExit(EXIT_TERMINATED if _Terminated.received else EXIT_INTERRUPTED) from None
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise
                # A path given with a name past the file system's limit: Path.exists() and is_file() raise on it
                # (Python 3.11 passes over only a missing file), and each command's first check of an input or an
                # output met it as a traceback. A staged output was removed as the error unwound, as on any other.
                _exit_on_long_name(exc)
            except SystemExit as exc:
                interrupted = exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED)
                if exc.code == EXIT_INTERRUPTED and _Terminated.received:
                    raise SystemExit(EXIT_TERMINATED) from None
                raise
            finally:
                if interrupted:  # before the flush: a Ctrl-C or SIGTERM while the streams are flushed ends it at once
                    _shutting_down_after_interrupt()
                else:
                    if previous is not None:
                        signal.signal(signal.SIGTERM, previous)
                    _give_back_sigint(previous_sigint)
                _end_guard(streams)

        return wrapped

    return decorate


def _exit_with(status: int, signum, frame) -> None:
    for stream in (sys.stdout, sys.stderr):  # what main printed is flushed; os._exit skips Python's own flush
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError):  # closed, or the signal came in the middle of a write
            pass
    os._exit(status)


def exit_when_done(status: object) -> None:
    """``sys.exit(status)`` of a command whose ``main`` has returned ``status``: its outputs are complete and its lines
    printed, and the status stands. A Ctrl-C while the interpreter then shuts down (exit handlers, freeing torch and
    numpy: a large part of a second) gave status 130 and no line over a complete output folder, or "Exception ignored
    in atexit callback" and a KeyboardInterrupt traceback. From here on Ctrl-C is ignored (SIG_IGN, which the
    interpreter's finalization keeps, where it resets handlers written in Python to the default: status 130 again).
    SIGTERM ends the process at once, with the status, while the threads still running are waited for; from the exit
    handlers on it is ignored too: the finalization reset its handler to the default as well, and a SIGTERM while
    torch and numpy were freed killed the process with status 143 and no line over complete outputs."""
    code = 0 if status is None else status if isinstance(status, int) else 1  # sys.exit's codes
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, functools.partial(_exit_with, code))
    except ValueError:  # not the main thread
        pass
    else:
        atexit.register(_ignore_sigterm)  # registered last, so the first exit handler to run
    sys.exit(status)


def _ignore_sigterm() -> None:
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


def run_command(module: str) -> None:
    """``sys.exit(main())`` of the command that lives in ``module`` (``python -m engine.serve`` runs
    ``cli.engine_serve``): a Ctrl-C (or SIGTERM) while its imports load, before ``main`` runs (torch alone takes
    seconds), was a KeyboardInterrupt traceback through importlib with status -2; it is now the one line and status
    130 (143). Nothing is written before ``main`` runs."""
    _Terminated.received = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    interrupted = False
    try:
        main = importlib.import_module(module).main
    except KeyboardInterrupt:
        interrupted = True
        print(f"\n{NOTHING_WRITTEN}" if sys.stderr.isatty() else NOTHING_WRITTEN, file=sys.stderr)
        raise SystemExit(EXIT_TERMINATED if _Terminated.received else EXIT_INTERRUPTED) from None
    except SystemExit as exc:  # _interrupted_before_main's, which set the handlers of a process that only exits
        interrupted = exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED)
        raise
    finally:
        if interrupted:  # a second signal while the process exits ends it at once, quietly
            _shutting_down_after_interrupt()
        else:
            signal.signal(signal.SIGTERM, previous)
    exit_when_done(main())


def exit_with_parent() -> None:
    """For a child process (the server's engine, a tensor-parallel worker): be sent SIGTERM, and unwind on it,
    when the parent dies. A parent killed with SIGKILL cannot stop its children, which kept loading a model
    or holding the GPU with nobody to serve. Linux only (prctl); elsewhere nothing changes."""

    def unwind(signum, frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    if _signal_on_parent_death(signal.SIGTERM) and _parent_gone():  # it died before the request was made
        raise SystemExit(128 + signal.SIGTERM)


def defer_sigterm_to_parent(*, pass_on: bool) -> None:
    """For a child process its parent stops itself (the server's engine once loaded, a tensor-parallel worker): a
    SIGTERM while the parent lives is left to the parent rather than taken. systemd (KillMode=control-group), `timeout`
    and `kill -- -PGID` send it to every process of the group at once: the server's engine unwound at once, and the
    server, finding it dead, failed the requests in flight with a 500 and exited with status 1 and an error, where a
    SIGTERM to the server alone drains them and exits 0 (and a worker's requests failed in their next collective).
    ``pass_on``: send it on to the parent, so that a SIGTERM to the engine alone is still the server's graceful
    shutdown; else ignore it (a worker: its parent-death signal also comes when the thread that started it ends, its
    parent living on). Once the parent is gone (exit_with_parent's parent-death signal), a SIGTERM unwinds as there."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not a child of multiprocessing's: nobody to leave it to
        return
    parent_pid = parent.pid

    def defer(signum, frame) -> None:
        if _parent_gone():
            raise SystemExit(128 + signum)
        if not pass_on:
            return
        try:
            os.kill(parent_pid, signum)  # (the parent, signalled with its group, gets it twice: it shuts down once)
        except ProcessLookupError:  # it exited just now
            raise SystemExit(128 + signum) from None

    signal.signal(signal.SIGTERM, defer)


def end_with_parent() -> None:
    """For a pool's worker process, which holds nothing to clean up: end at once (SIGKILL) when the parent dies. A
    parent killed with SIGKILL (``timeout -s KILL``, the out-of-memory killer) cannot stop its pool, and the idle
    workers of a capacity sweep or of --bands waited for work forever, each holding its own end of the pool's queues
    open. Linux only (prctl); elsewhere nothing changes."""
    if _signal_on_parent_death(signal.SIGKILL) and _parent_gone():  # it died before the request was made
        os._exit(128 + signal.SIGKILL)


def _signal_on_parent_death(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies; False where it cannot (no prctl)."""
    name = ctypes.util.find_library("c")
    try:
        prctl = ctypes.CDLL(name, use_errno=True).prctl if name else None
    except (OSError, AttributeError):
        prctl = None
    if prctl is None:
        return False
    pr_set_pdeathsig = 1  # linux/prctl.h
    prctl(pr_set_pdeathsig, signum)
    return True


def _parent_gone() -> bool:
    parent = multiprocessing.parent_process()
    return parent is not None and os.getppid() != parent.pid


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)`` for a command: a Ctrl-C or SIGTERM cancels the coroutine's task (what it awaits is
    cancelled with it, its ``finally`` blocks close connections) and is raised as a KeyboardInterrupt once the loop
    has stopped. asyncio.run does this itself only where Python's default handler is in place, which a command's
    (``exit_130_on_interrupt``) is not: the handler raised inside whichever task the loop was running, and
    asyncio.run's shutdown logged that task's "exception was never retrieved" traceback under the command's one line
    (traces.bench, seen in CI). A second signal while the cancellation unwinds is raised at once: nothing hangs."""
    import asyncio

    signals: list[int] = []

    async def cancellable() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()

        def on_signal(signum, frame) -> None:
            if signum == signal.SIGTERM:
                _Terminated.received = True
            if _unwinding_an_interrupt():
                return
            if signals:
                raise KeyboardInterrupt
            signals.append(signum)
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wakes a loop asleep in select() to run the cancellation

        replaced = {}
        for signum, ours in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
            if signal.getsignal(signum) is ours:  # a command's handler (another's is left alone)
                replaced[signum] = signal.signal(signum, on_signal)
        try:
            return await coroutine
        finally:
            for signum, handler in replaced.items():
                signal.signal(signum, handler)

    try:
        result = asyncio.run(cancellable())
    except asyncio.CancelledError:
        if signals:
            raise KeyboardInterrupt from None
        raise
    finally:
        coroutine.close()  # one never started (a signal before the loop ran it) warned "never awaited"
    if signals:  # the coroutine caught the cancellation and returned: the command was interrupted all the same
        raise KeyboardInterrupt
    return result
