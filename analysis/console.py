"""What the analysis commands print on stdout, when stdout may be a pipe whose reader leaves early.

``python -m analysis.compare A B | head -3`` closed the pipe after three lines; the next print raised
BrokenPipeError, a traceback, and compare had not yet written its outputs. A command's printed table is a view
of what it writes, so a reader that has gone must not stop the writing: from then on, what it prints goes to
os.devnull and the command finishes as it would have.
"""

from __future__ import annotations

import os
import sys


def print_out(text: str) -> None:
    """print(text) to stdout, flushed at once (a BrokenPipeError surfaces here, not at exit where it cannot be
    caught), and silenced for the rest of the command once the reader has closed the pipe."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _discard_stdout()


def _discard_stdout() -> None:
    """Point stdout's file descriptor at os.devnull: the text still buffered, and the interpreter's flush at exit,
    go nowhere instead of raising again ("Exception ignored ... BrokenPipeError" and status 120)."""
    try:
        fileno = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stdout (a test's capture) has no descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fileno)
    finally:
        os.close(devnull)
