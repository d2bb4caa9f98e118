"""Writing the sim tools' outputs whole or not at all, and refusing an output that is one of the inputs."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place: an interrupted write leaves the old file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory; expected a file path", str(path))
    if path.exists() and not path.is_file():  # a device or FIFO: the rename would replace the node itself
        raise OSError(17, "exists and is not a regular file; expected a file path", str(path))
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def check_output_path(path: Path, option: str, inputs: list[Path]) -> str | None:
    """Why ``path`` cannot take an output (it is an input, a folder, or under a file), or None when it can."""
    path = Path(path)
    if not path.name:
        return f"{option} is empty; expected a file path"
    for source in inputs:
        if path.exists() and Path(source).exists() and path.resolve() == Path(source).resolve():
            return f"{option} {path} is one of the inputs ({source}); write elsewhere"
    if path.is_dir():
        return f"{option} {path} is a directory; expected a file path"
    if path.exists() and not path.is_file():
        return f"{option} {path} exists and is not a regular file"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{option} {path}: {parent} is a file, not a folder"
            if not os.access(parent, os.W_OK):
                return f"{option} {path}: the folder {parent} is not writable"
            break
    return None
