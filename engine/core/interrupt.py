"""Ctrl-C at a command line: exit status 130 and one line on stderr, never a KeyboardInterrupt traceback.

Every command writes its outputs beside their targets and renames them into place when complete, so an
interrupted command leaves no partial file; the line says what is left, which each command knows.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C

NOTHING_WRITTEN = "interrupted: nothing written"
EACH_FILE_WHOLE = "interrupted: files finished before it are written, none in part"


def exit_130_on_interrupt(message: str = NOTHING_WRITTEN) -> Callable:
    """Decorate a ``main(argv)``: on KeyboardInterrupt print ``message`` and exit with status 130."""

    def decorate(main: Callable) -> Callable:
        @functools.wraps(main)
        def wrapped(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"\n{message}" if sys.stderr.isatty() else message, file=sys.stderr)
                raise SystemExit(EXIT_INTERRUPTED) from None

        return wrapped

    return decorate
