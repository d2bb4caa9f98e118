"""Output folders that are written whole or not at all.

A command writes into a hidden folder beside its target and renames it into place only when every
file is written; an interrupted or failed run leaves the target as it was. An existing non-empty
target is refused unless the caller asked to overwrite it, and then it is replaced as a whole (no
stale file from an earlier run survives). The staging folder is made before any work, so an
unwritable --out fails at once rather than after a long simulation.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from analysis.process_pools import interrupts_held
from engine.core.interrupt import InterruptedOnceWritten
from engine.core.messages import escape_controls
from sim.files import RUN_FILES, existing_parent
from traces.files import (
    enclosing_output_folder,
    existing_path,
    make_folders,
    remove_empty,
    remove_stale_staging,
    staging_path,
)


class OutDirError(ValueError):
    """An output folder that cannot be used; the message names it and says why."""


def out_folder(text: str) -> str:
    """argparse type of an output folder option: an empty one (--out "") meant the default folder under runs/
    for some commands and the current folder for others; neither is what was typed."""
    if not text.strip():
        import argparse

        raise argparse.ArgumentTypeError("is empty; name a folder for the run")
    return text


def default_out_dir(prefix: str, name: str) -> Path:
    """``runs/<prefix>-<name>-<timestamp>``, with ``-2``, ``-3``, ... when that folder already exists. ``name`` (a
    trace's file name) is cut to 100 characters: a valid 240-character trace name made a folder name past the file
    system's 255 bytes, and ``exists()`` on it raised OSError (a traceback)."""
    name = name.encode()[:100].decode(errors="ignore")
    base = Path("runs") / f"{prefix}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = base
    n = 1
    while out.exists():
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def check_out_dir(target: Path, *, overwrite: bool, option: str = "--out", inputs: Iterable[Path] = ()) -> None:
    """Refuse a target that is a file, or a non-empty folder unless ``overwrite`` and it is an earlier run's,
    or one that is or holds one of the command's ``inputs`` (an input run folder is itself an earlier run's:
    analysis.compare A B --out A --overwrite replaced A with the comparison), or lies inside an input folder or
    inside any command's output folder (``enclosing_output_folder``)."""
    try:
        resolved = Path(target).resolve()
    except (RuntimeError, OSError) as exc:  # a symbolic link loop: Python 3.11 raised RuntimeError (a traceback)
        if isinstance(exc, OSError) and exc.errno != errno.ELOOP:
            raise OutDirError(f"{option} {target}: {exc.strerror or exc}") from None
        raise OutDirError(f"{option} {target}: a symbolic link loop; expected a folder") from None
    absolute = Path(os.path.abspath(target))
    for given in inputs:
        # Resolved, and also as typed: an input reached through a link inside the target (q/requests.parquet
        # -> elsewhere) is a name in the target that replacing it would delete.
        for source, folder in ((Path(given).resolve(), resolved), (Path(os.path.abspath(given)), absolute)):
            if source == folder or folder in source.parents:
                raise OutDirError(f"{option} {target} is or holds the input {source}; write the output elsewhere")
            # An input run folder is read whole (analysis.compare A B --out A/cmp put a folder into run A, which
            # sim.replay --out A --overwrite then refused as a file no run wrote): inputs are never written to.
            if source in folder.parents and source.is_dir():
                raise OutDirError(f"{option} {target} is inside the input folder {source}; write the output "
                                  "elsewhere")
    enclosing = enclosing_output_folder(absolute)
    if enclosing is not None:
        raise OutDirError(f"{option} {target} is inside {enclosing[0]}, the output folder of an earlier command (it "
                          f"holds {enclosing[1]}); write the output beside it, not in it")
    if target.exists() and not target.is_dir():
        raise OutDirError(f"{option} {target} exists and is not a folder")
    parent = existing_parent(target)
    if parent is not None and not parent.is_dir():  # mkdir said only "cannot write there (File exists)"
        raise OutDirError(f"{option} {target}: {parent} is a file, not a folder")
    if not target.is_dir():
        return
    cwd = Path.cwd().resolve()
    if target.resolve() in (cwd, *cwd.parents):  # it is replaced as a whole: never the folder we stand in
        raise OutDirError(f"{option} {target} is the current folder or one above it; name a folder for the run")
    entries = list(target.iterdir())
    if entries and not overwrite:
        raise OutDirError(f"{option} {target} exists and is not empty; pass --overwrite to replace it")
    # A run writes plain files only: a folder or a link under a run file's name is someone else's.
    foreign = sorted(p.name for p in entries if p.name not in RUN_FILES or p.is_symlink() or not p.is_file())
    if foreign:
        raise OutDirError(f"{option} {target} holds files no run wrote ({', '.join(foreign[:3])}"
                          f"{', ...' if len(foreign) > 3 else ''}); --overwrite replaces only an earlier run's folder")


def folder_complete(out_dir: Path) -> str:
    """What an interrupt's line says of an output folder in place (``outputs_in_place``)."""
    return f"the outputs in {escape_controls(out_dir)}/ are complete"


def input_files(args) -> list[Path]:
    """The files a command line reads, from its parsed options (trace, cost model, host timeline, prices): what
    its --out must not replace. Options that are not paths (auto, calibrated, a number) name no file."""
    names = [getattr(args, name, None) for name in ("trace", "cost_model", "host_slowdown", "gpu_cost")]
    return [Path(name) for name in names if isinstance(name, str) and name and existing_path(name) is not None]


@contextmanager
def staged_out_dir(target: Path, *, overwrite: bool, option: str = "--out",
                   inputs: Iterable[Path] = ()) -> Iterator[Path]:
    """Yield a fresh staging folder beside ``target``; on success it becomes ``target``. A Ctrl-C (or SIGTERM) that
    comes as it does is acted on once it is in place, as InterruptedOnceWritten."""
    check_out_dir(Path(target), overwrite=overwrite, option=option, inputs=inputs)
    done = folder_complete(target)  # as typed, as the commands print it
    target = Path(target).resolve()  # "." has no name to put a staging folder beside
    stage = staging_path(target, "partial")
    created: list[Path] = []
    try:
        make_folders(target.parent, created)
        remove_stale_staging(target)
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
    except OSError as exc:
        remove_empty(created)
        raise OutDirError(f"{option} {target}: cannot write there ({exc.strerror or exc})") from None
    written = False
    try:
        yield stage
        # Held off until the run is in place and the one it replaces is gone: a Ctrl-C between the renames or while
        # that run was removed left it hidden as .OUT.old-PID (whole or in part), and the command said nothing was
        # written over the new run in place.
        try:
            with interrupts_held():
                _move_into_place(stage, target, overwrite=overwrite, option=option)
                written = True
        except KeyboardInterrupt:
            if not written:  # the move failed: nothing of this run was kept
                raise
            raise InterruptedOnceWritten(done) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if not written:  # --out new/deeper/run with a bad trace left new/deeper/ behind, empty
            remove_empty(created)


def _move_into_place(stage: Path, target: Path, *, overwrite: bool, option: str) -> None:
    """Rename ``stage`` to ``target``, replacing an earlier run there where ``overwrite``; on failure the earlier run
    is left in place."""
    old = staging_path(target, "old")
    try:
        if overwrite and target.exists():
            target.rename(old)
        # One rename, which fails on a non-empty folder: a run that wrote the target meanwhile (two commands
        # given one --out) is never replaced without --overwrite, nor mixed with this one.
        stage.rename(target)
    except BaseException as exc:
        # The earlier run --overwrite was to replace goes back in place: on any failed rename, which left it hidden
        # as .OUT.old-PID and no OUT at all.
        if old.exists() and not target.exists():
            old.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        if not isinstance(exc, OSError) or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR,
                                                             errno.EISDIR):
            raise
        raise OutDirError(f"{option} {target} was written by another command while this one ran; nothing of "
                          f"this run was kept (give each run its own {option})") from None
    shutil.rmtree(old, ignore_errors=True)  # the earlier run this one replaced
