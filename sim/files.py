"""Reading the sim tools' inputs and writing their outputs whole or not at all, refusing an output that is one of
the inputs."""

from __future__ import annotations

import errno
import inspect
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from traces.files import (
    is_link_loop,
    long_name_problem,
    open_parquet,
    output_file_problem,
    remove_stale_staging,
    staging_path,
)

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

# What the commands write into a run folder: --overwrite replaces a folder holding only these, never
# one that holds anything else (a mistyped --out . or --out ~ must not take a home directory with it).
# Here, not in analysis.outdir, so that sim.host_speed can protect a run's files without importing analysis.
RUN_FILES = frozenset({
    "requests.parquet", "steps.parquet", "summary.json", "report.html", "run.json",
    "capacity.json", "capacity.parquet", "compare.json", "compare.md", "compare.parquet",
})


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place: an interrupted write leaves the old file."""
    write_bytes_atomic(path, text.encode())


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path`` and rename it into place: an interrupted write leaves the old file, and a
    ``path`` that is a link is replaced, not written through."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory; expected a file path", str(path))
    if path.exists() and not path.is_file():  # a device or FIFO: the rename would replace the node itself
        raise OSError(17, "exists and is not a regular file; expected a file path", str(path))
    # A writer killed by SIGKILL (the out-of-memory killer, `timeout -s KILL`) left its hidden staging file behind, a
    # whole report's or profile's worth, for ever: folders' writers swept theirs, this one did not.
    remove_stale_staging(path)
    partial = staging_path(path, "partial")
    try:
        partial.write_bytes(data)
        if path.is_file():
            # The file it replaces keeps its permissions: a profile calibrated in place (group-writable in a team's
            # folder, or made read-only) came back with the umask's, as a new file.
            os.chmod(partial, stat.S_IMODE(path.stat().st_mode))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


# The JSON inputs (profiles ~100 KB, summaries a few KB) are far below this; a larger "file" is not one of them,
# and /dev/zero has no end at all.
MAX_JSON_INPUT_BYTES = 256 * 2**20


def read_json_input(path: Path, max_bytes: int = MAX_JSON_INPUT_BYTES) -> str:
    """The text of a regular file of at most ``max_bytes``; OSError (with strerror) otherwise: a FIFO blocked the
    read forever and /dev/zero filled memory until the process was killed."""
    path = Path(path)
    if is_link_loop(path):
        raise OSError(errno.ELOOP, "a symbolic link loop", str(path))
    if not path.exists():
        raise FileNotFoundError(2, "no such file", str(path))
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory; expected a file", str(path))
    if not path.is_file():
        raise OSError(22, "not a regular file: a FIFO or a device", str(path))
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(27, f"larger than {max_bytes // 2**20} MiB; not a file this command writes", str(path))
    # utf-8-sig: a leading byte order mark (an editor's or PowerShell's) is dropped, as the trace converters and the
    # host-speed CSV drop it; json.loads refused it ("Unexpected UTF-8 BOM") and a price file read "\ufeffh200".
    return data.decode("utf-8-sig")


def check_output_path(path: str | Path, option: str, inputs: list[Path], *, overwrite: bool = True) -> str | None:
    """Why ``path`` cannot take an output (it is an input, a folder, or under a file; or, without ``overwrite``, an
    existing file), or None when it can. Given as typed (a string), a path ending in '/' names a folder: Path()
    drops the slash, and the file was written under the folder's name (--out timelines/ made a file 'timelines')."""
    if isinstance(path, str) and path.endswith(("/", os.sep)):
        return f"{option} {path} ends with '/', a folder; expected a file path"
    path = Path(path)
    if not path.name:
        return f"{option} is empty; expected a file path"
    too_long = long_name_problem(path, option)
    if too_long:  # every Path test below raised OSError on it
        return too_long
    for source in inputs:
        if path.exists() and Path(source).exists() and path.resolve() == Path(source).resolve():
            return f"{option} {path} is one of the inputs ({source}); write elsewhere"
    if path.is_dir():
        return f"{option} {path} is a directory; expected a file path"
    inside = output_file_problem(path)
    if inside is not None:
        return f"{option} {path} {inside}"
    if path.exists() and not path.is_file():
        return f"{option} {path} exists and is not a regular file"
    if not overwrite and (path.exists() or path.is_symlink()):
        return f"{option} {path} exists; pass --overwrite to replace it"
    parent = existing_parent(path)
    if parent is not None:
        if not parent.is_dir():
            return f"{option} {path}: {parent} is a file, not a folder"
        if not os.access(parent, os.W_OK):
            return f"{option} {path}: the folder {parent} is not writable"
    return None


def repeated_input_problem(given: list[str | Path], what: str) -> str | None:
    """One line naming the first of ``given`` (inputs described by ``what``, "run folder") that another spelling
    of the same path (a trailing '/', ./DIR, a symbolic link) already named, or a folder holding the same run as one
    already named (a copy: the run id its files record, ``sim.run_id``), or None. A run given twice counted its steps,
    requests or figures twice at exit 0; the scripts that read several runs share this check."""
    from sim.run_id import run_ids  # sim.run_id reads its files through this module

    seen: dict[str, str] = {}
    runs: dict[str, str] = {}  # run id -> the folder first named with it
    for item in given:
        real = os.path.realpath(item)  # not Path.resolve: a symbolic link loop raised a RuntimeError traceback
        if real in seen:
            return f"{what} {item} is given twice (also as {seen[real]}); give each once"
        seen[real] = str(item)
        # The first id its files record (files of two runs in one folder are refused by name where it is read).
        run_id = next(iter(run_ids(Path(item)).values()), None) if os.path.isdir(item) else None
        if run_id is not None and run_id in runs:  # cp -r RUN COPY: every step of the run counted twice
            return f"{what} {item} holds the run {runs[run_id]} holds (run id {run_id}, a copy); give each run once"
        if run_id is not None:
            runs[run_id] = str(item)
    return None


def existing_parent(path: Path) -> Path | None:
    """The nearest path above ``path`` that exists (named as given), or None: where the folders down to ``path``
    would be made, or the file that stops them (an output file's folder and an --out folder both check it)."""
    return next((parent for parent in Path(path).parents if parent.exists()), None)


# Parquet through a handle Python opened: polars and pyarrow take a path as UTF-8 text (pyarrow parses it as a URI),
# and a name holding another byte (an --out of b'\xff', given by Python as '\udcff') could not be read, nor written
# after a whole run ("Object does not have a .write() method"). pyarrow and polars are imported when first used.


def read_parquet_table(path: Path, columns: list[str] | None = None) -> pa.Table:
    parquet = open_parquet(path)  # in memory arrow owns: see there why
    # A column given twice: arrow's refusal quoted the whole schema over as many lines, and named no file.
    names = parquet.schema_arrow.names
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise ValueError(f"{path}: column {repeated!r} appears {names.count(repeated)} times; expected each column "
                         "once")
    missing = [name for name in columns or () if name not in names]
    if missing:  # ParquetFile.read leaves out a column it does not find
        raise ValueError(f"{path}: no column {missing[0]!r}; expected a steps.parquet that has it")
    return parquet.read(columns=columns)


def read_parquet_frame(path: Path) -> pl.DataFrame:
    import polars as pl

    with open(path, "rb") as handle:
        return pl.read_parquet(handle)


def write_parquet_frame(frame: pl.DataFrame, path: Path, **options) -> None:
    """An I/O error of the write (a full disk) is OSError, as pyarrow's: polars raised its own ComputeError ('File out
    of specification: underlying IO error: No space left on device (os error 28)'), a traceback past the commands'
    one-line handling of a full disk."""
    import polars as pl

    if "metadata" in options and "metadata" not in inspect.signature(pl.DataFrame.write_parquet).parameters:
        # A polars too old to write key-value metadata (pyproject allows 1.0): the run is written without its id
        # (sim.run_id), which its readers take for a run written before run ids, rather than not at all.
        options = {key: value for key, value in options.items() if key != "metadata"}
    with open(path, "wb") as handle:
        try:
            frame.write_parquet(handle, **options)
        except pl.exceptions.PolarsError as exc:
            code = re.search(r"\(os error (\d+)\)", str(exc))
            if code is None:
                raise
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None
