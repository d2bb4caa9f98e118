"""Where a file is staged before it is renamed into place (traces, sim and analysis all write outputs whole)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from engine.core.messages import escape_controls

if TYPE_CHECKING:
    import pyarrow.parquet as pq

NAME_MAX_BYTES = 255  # the longest file name ext4, XFS, btrfs and tmpfs hold


def existing_path(value: str | Path) -> Path | None:
    """The path ``value`` names where something exists there, else None, also where the text cannot name a file at
    all (a name over the file system's 255 bytes). For option values that are a file or something else (a number,
    price pairs, a tokenizer's hub name): Path.exists() and is_file() raise on a long name, so --host-slowdown
    1.000... (300 digits) or --gpu-cost h200=3.000... was refused as "--out ...: File name too long"."""
    path = Path(value)
    try:
        path.stat()
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        return None
    return path


def is_link_loop(path: str | Path) -> bool:
    """Whether a symbolic link loop on the way keeps ``path`` from being reached. Path.exists() is False there, as
    for a missing file: inputs named so were refused as "no such file", which sent the user looking for a file that
    is there."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    except ValueError:  # a NUL byte in the name
        return False
    return False


def long_name_problem(path: str | Path, option: str) -> str | None:
    """Why ``path`` cannot name a file at all (a name in it over the file system's 255 bytes), or None. Path.exists()
    raises on such a name: an output path checked by hand met it as an OSError traceback (benchmarks/*.py --json,
    --out-dir)."""
    name = next((part for part in Path(path).parts if len(os.fsencode(part)) > NAME_MAX_BYTES), None)
    if name is None:
        return None
    return (f"{option} {path}: a name in it is {len(os.fsencode(name))} bytes long; expected a path whose names are "
            f"at most {NAME_MAX_BYTES} bytes each")


def staging_path(path: Path, tag: str, pid: int | None = None) -> Path:
    """The hidden sibling ``.NAME.TAG-PID`` that ``path`` is written as before it is renamed into place, by this
    process or the one of ``pid``. A name near the file system's limit is shortened to its head and a hash of the
    whole: an --out of 250 characters, a valid name, was refused as "File name too long" because its staging name
    was not."""
    path = Path(path)
    suffix = f".{tag}-{os.getpid() if pid is None else pid}"
    name = f".{path.name}{suffix}"
    # os.fsencode: a name holding an undecodable byte (an --out of b'\xff', read as '\udcff') has bytes on disk,
    # where str.encode raised UnicodeEncodeError.
    if len(os.fsencode(name)) > NAME_MAX_BYTES:
        head = os.fsdecode(os.fsencode(path.name)[:150])
        name = f".{head}-{hashlib.sha1(os.fsencode(path.name)).hexdigest()[:16]}{suffix}"
    return path.with_name(name)


def process_exists(pid: int) -> bool:
    """Whether a process of ``pid`` runs on this host (another user's included); True where that cannot be told."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process is there
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: another user's process; a number past any pid: not ours to judge
        return True
    return True


def remove_stale_staging(path: Path, tag: str = "partial") -> None:
    """Remove ``path``'s staging siblings (``staging_path``) named by a process that no longer runs on this host,
    saying so on stderr: a writer killed by SIGKILL (the out-of-memory killer, ``timeout -s KILL``) cannot remove
    its own, and each one left a whole run's or trace's worth of disk behind, hidden. A staging name of a process
    that runs (another run writing the same target now) is left alone, as is any name no staging_path of ``path``
    has."""
    path = Path(path)
    marker = f".{tag}-"
    try:
        entries = [entry for entry in path.parent.iterdir() if marker in entry.name]
    except OSError:  # a parent that cannot be listed: the writer itself says why it cannot write there
        return
    for entry in entries:
        pid_text = entry.name.rpartition(marker)[2]
        if not (pid_text.isascii() and pid_text.isdigit()):
            continue
        pid = int(pid_text)
        if entry.name != staging_path(path, tag, pid).name or pid == os.getpid() or process_exists(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        if not os.path.lexists(entry):  # what could not be removed (another user's files) is not said to be
            print(f"note: removed {escape_controls(entry)}, left by a writer (pid {pid}) that was killed before it "
                  "finished", file=sys.stderr)


# The pairs of files that mark a folder as a command's output (a run's, a capacity plan's, a comparison's): both of a
# pair, not summary.json or report.html, which a folder of the user's own that holds runs may hold too, nor one stray
# requests.parquet in a home folder, which would refuse every run made under it.
_OUTPUT_MARKS = (("requests.parquet", "steps.parquet"), ("capacity.json", "capacity.parquet"),
                 ("compare.json", "compare.parquet"))


def enclosing_output_folder(target: Path) -> tuple[Path, str] | None:
    """The nearest folder above ``target`` (an absolute path) that is a command's output folder, and the files that
    mark it so ("requests.parquet and steps.parquet"); None where none is. An output nested in one (--out RUN/sub)
    made RUN a folder that no command wrote whole: --overwrite then refused it for the folder it held, and its
    readers took it for one run. Output files are held to it too (``output_file_problem``)."""
    for folder in target.parents:
        for pair in _OUTPUT_MARKS:
            if all((folder / name).is_file() for name in pair):
                return folder, " and ".join(pair)
    return None


def output_file_problem(path: str | Path) -> str | None:
    """Why an output file may not be written at ``path``, or None: it lies in a command's output folder. A trace or a
    timeline written there (traces.synth -o RUN/requests.parquet --overwrite) replaced a run's own table, and any
    other file made the folder one that no command wrote whole (sim.replay --overwrite then refused it)."""
    enclosing = enclosing_output_folder(Path(os.path.abspath(path)))
    if enclosing is None:
        return None
    return (f"is inside {escape_controls(enclosing[0])}, the output folder of an earlier command (it holds "
            f"{enclosing[1]}); write the file beside it, not in it")


def refuse_to_replace(path: str | Path, overwrite: bool) -> None:
    """FileExistsError for an existing file at ``path`` unless ``overwrite``: traces.convert and traces.synth
    renamed their parquet over whatever file -o named (another trace, a day's conversion) without a word. Called
    before any work, so a refused command costs nothing; what is not a regular file is refused by the writer.
    IsADirectoryError for a path as typed that ends with a separator ('-o out/'): Path drops the slash, and a
    file named 'out' was written where a folder was meant."""
    if isinstance(path, str) and path.endswith(tuple({os.sep, os.altsep or os.sep})):
        raise IsADirectoryError(errno.EISDIR, "ends with a path separator, naming a folder; expected a parquet file "
                                "path", path)
    problem = output_file_problem(path)  # first: --overwrite would not help
    if problem is not None:
        raise PermissionError(errno.EPERM, problem, str(path))
    # A link to nothing (dangling, or a loop) is a name too, replaced by the rename as a file is: sim's outputs
    # (sim.files.check_output_path) refused it already.
    if not overwrite and (Path(path).is_file() or (Path(path).is_symlink() and not Path(path).exists())):
        raise FileExistsError(errno.EEXIST, "exists; pass --overwrite to replace it", str(path))


def make_folders(folder: Path, made: list[Path]) -> None:
    """``mkdir -p folder``, putting each folder it makes at the front of ``made`` (deepest first) as it goes, so a
    run that fails, even half way through making them, can take them back."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for parent in reversed(missing):
        parent.mkdir(exist_ok=True)
        made.insert(0, parent)


def remove_empty(folders: Iterable[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty: never anything another command put in them."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


# A parquet file ends with its footer's length (4 bytes) and a magic number: PAR1, or PARE for an encrypted footer.
PARQUET_MAGICS = (b"PAR1", b"PARE")
# What arrow says of a file of 8 bytes or more that ends otherwise (the readers' messages quote it).
PARQUET_FOOTER_PROBLEM = ("Parquet magic bytes not found in footer. Either the file is corrupted or this is not a "
                          "parquet file.")


def ends_as_parquet(handle: BinaryIO, size: int) -> bool:
    """Whether the open file ``handle`` of ``size`` bytes ends with a parquet magic number, read from its last bytes
    alone; True for one under 8 bytes too, whose size arrow names itself, as cheaply."""
    if size < 8:
        return True
    handle.seek(size - 4)
    return handle.read(4) in PARQUET_MAGICS


def open_parquet(path: str | Path) -> pq.ParquetFile:
    """The parquet file at ``path``, read whole into memory arrow owns (one copy), through a Python handle (pyarrow
    parses a path string as a URI, in UTF-8). Read straight from the handle, arrow's reader threads held the
    handle's Python buffers and could release the last one after the read had returned: a command that failed
    right after reading (too few steps) aborted at exit, refused the GIL (exit 134 after its error line, about
    every other run). A file that does not end as a parquet file does is refused before it is read (arrow's own
    words): a sparse 100 GB file named as a trace was read whole, until the machine's memory ran out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if not ends_as_parquet(handle, size):
            raise pa.ArrowInvalid(PARQUET_FOOTER_PROBLEM)
        handle.seek(0)
        data = pa.allocate_buffer(size)
        with memoryview(data) as view:
            filled = 0
            while filled < size and (count := handle.readinto(view[filled:])):
                filled += count
    return pq.ParquetFile(pa.BufferReader(data.slice(0, filled)))
