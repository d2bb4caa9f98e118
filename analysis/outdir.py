"""Default output folders of the CLIs: a fresh ``runs/<prefix>-<name>-<timestamp>[-N]`` each time."""

from __future__ import annotations

import time
from pathlib import Path


def default_out_dir(prefix: str, name: str) -> Path:
    """A path under runs/ that does not exist yet; ``-2``, ``-3``, ... are added within the same second."""
    base = Path("runs") / f"{prefix}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, number = base, 1
    while out.exists():
        number += 1
        out = base.with_name(f"{base.name}-{number}")
    return out
