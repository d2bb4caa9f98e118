"""The commands' progress bars on stderr, closed however the work under them ends (a Ctrl-C or SIGTERM included),
so that the line a command prints then starts a line of its own."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from analysis.process_pools import interrupts_held

if TYPE_CHECKING:
    from tqdm import tqdm


@contextlib.contextmanager
def progress_bar(quiet: bool, **options) -> Iterator[tqdm | None]:
    """A tqdm bar on stderr made with ``options`` (None when ``quiet``), closed when the block ends.

    tqdm draws the bar inside its constructor: a Ctrl-C just as the bar showed (on a loaded machine the command can
    be descheduled right after the draw) was a KeyboardInterrupt before the bar was the command's to close, and the
    interrupt's line went onto the bar's ("bands:   0%| ... |interrupted: nothing written to ..."), which the
    signal tests, waiting for the bar to signal, met now and then. The constructor runs with Ctrl-C and SIGTERM held
    off: they are acted on once the bar is there to close."""
    if quiet:
        yield None
        return
    from tqdm import tqdm

    bar = None
    try:
        with interrupts_held():
            bar = tqdm(file=sys.stderr, **options)
        yield bar
    finally:
        if bar is not None:
            bar.close()
