"""CSV reading for the converters, with errors that name the file, the line and the field.

Columns are read as text and cast here, so a bad value is reported as
`FILE: line 7: field 'ContextTokens' is 'abc'; expected an integer` instead of a parser
error without a location. Blank lines are no records (as for Python's csv module); a
record's line is where it starts (a quoted field may hold line breaks; the header is line 1).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import polars as pl
import pyarrow as pa

from engine.core.messages import one_line, shown
from traces.errors import TraceError

# What reading a file through open_text may raise: EOFError is a compressed file cut short, zlib.error a corrupt
# gzip'd one, LZMAError a corrupt xz one, ArrowException a corrupt zstd one (bz2 raises OSError).
READ_ERRORS = (OSError, EOFError, UnicodeDecodeError, zlib.error, lzma.LZMAError, pa.ArrowException)

# A compressed source is recognised by its first bytes, whatever its name.
_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"\xfd7zXZ\x00": "xz",
          **{b"BZh" + str(level).encode(): "bz2" for level in range(1, 10)}}  # 'BZh' alone may start a header
_POLARS_READS = ("gzip", "zstd")  # compressions polars' CSV reader undoes itself; the others are undone here


def compression_of(path: Path) -> str | None:
    """'gzip', 'zstd', 'bz2' or 'xz' when the file starts with that format's magic bytes, else None."""
    with path.open("rb") as handle:
        head = handle.read(6)
    return next((name for magic, name in _MAGIC.items() if head.startswith(magic)), None)


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when it is compressed (zstd through pyarrow: the standard library has no
    zstd before Python 3.14)."""
    compression = compression_of(path)
    if compression == "gzip":
        return gzip.open(path)
    if compression == "bz2":
        return bz2.open(path)
    if compression == "xz":
        return lzma.open(path)
    if compression == "zstd":
        return io.BufferedReader(pa.input_stream(path, compression="zstd"))
    return path.open("rb")


def open_text(path: Path, newline: str | None = None) -> io.TextIOBase:
    """The file as UTF-8 text without a byte order mark, decompressed when it is gzip'd, zstd'd, bz2'd or xz'd
    (a zstd'd Mooncake file failed as 'can't decode byte 0xb5', and the CSV line checks read a zstd'd CSV, which
    polars reads, as no records: blank lines were kept as empty rows and errors named the wrong line)."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline=newline)


def read_error(path: Path, exc: Exception) -> str:
    """Why a source could not be read, for a one-line message: bytes that are no UTF-8 are most often a
    compressed or binary file, or text saved in Latin-1 or Windows-1252."""
    if isinstance(exc, UnicodeDecodeError):
        return not_utf8_error(path) or (f"{path}: cannot read: not UTF-8 text; expected UTF-8 text, plain or "
                                        "compressed with gzip, zstd, bz2 or xz")
    return f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"


def not_utf8_error(path: Path) -> str | None:
    """'FILE: line N: cannot read: not UTF-8 text (byte B at offset O)...' for the first byte that is no UTF-8, or
    None if every line decodes. The codec's own position counts from the start of the chunk it was decoding (a
    Latin-1 'e9' 148,087 bytes in was reported 'at 624'), and polars names no position at all, so the file is scanned
    again here; only errors ask."""
    offset = 0
    try:
        with open_binary(path) as handle:
            for line_no, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return (f"{path}: line {line_no}: cannot read: not UTF-8 text (byte {raw[exc.start]:02x} at offset "
                            f"{offset + exc.start}); expected UTF-8 text, plain or compressed with gzip, zstd, bz2 or "
                            "xz (iconv -f WINDOWS-1252 -t UTF-8 converts Windows text)")
                offset += len(raw)
    except READ_ERRORS:
        return None
    return None


def _data_records(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(1-based line the record starts on, fields) for every record after the header, blank lines ([]) included;
    the header is the first record that is not blank (polars skips blank lines before it too)."""
    with open_text(path, newline="") as handle:
        reader = csv.reader(handle)
        start, header = 1, False
        for fields in reader:
            if header:
                yield start, fields
            header = header or bool(fields)
            start = reader.line_num + 1


def line_of_row(path: Path, row: int) -> int:
    """1-based file line that 0-based data row `row` (blank lines skipped, as read_csv_text does) starts on; only
    errors ask, so the csv module's slow scan costs nothing on a good file. One record per line if unreadable."""
    try:
        data = (start for start, fields in _data_records(path) if fields)
        for index, start in enumerate(data):
            if index == row:
                return start
    except (*READ_ERRORS, csv.Error):
        pass
    return row + 2


def _drop_blank_lines(path: Path, frame: pl.DataFrame) -> pl.DataFrame:
    """The frame without the rows polars makes of blank lines (every field null). A row of empty fields (',,')
    reads the same, so the csv module tells which rows are blank lines; it runs only when there are such rows."""
    if not frame.height or not frame.select(pl.all_horizontal(pl.all().is_null()).any()).item():
        return frame
    try:
        blank = [not fields for _, fields in _data_records(path)]
    except (*READ_ERRORS, csv.Error):
        return frame
    if len(blank) != frame.height:  # the two readers disagree on the records: keep every row, errors name it
        return frame
    return frame.filter(~pl.Series(blank))


def check_source_file(path: Path, expected: str) -> None:
    """TraceError unless ``path`` is a regular file: a FIFO blocks a read forever and /dev/zero never ends."""
    if path.is_dir():
        raise TraceError(f"{path}: cannot read: it is a directory; expected {expected}")
    if not path.is_file():
        what = "not a regular file" if path.exists() else "no such file"
        raise TraceError(f"{path}: cannot read: {what}; expected {expected}")
    with path.open("rb") as handle:
        head = handle.read(8)
    _refuse_containers(path, head, expected)
    # Excel's "Unicode text" is UTF-16: polars read it as a header of names full of NUL bytes that matched nothing.
    for mark, encoding in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                           (b"\xfe\xff", "UTF-16")):
        if head.startswith(mark):
            raise TraceError(f"{path}: cannot read: {encoding} text (its byte order mark says so); expected {expected} "
                             f"in UTF-8 (iconv -f {encoding} -t UTF-8 converts it)")


# Files that hold no text of their own, by their first bytes. Read as text, a zip failed as 'its lines end in a bare
# carriage return' and a parquet trace as a ragged CSV line.
_CONTAINERS = {b"PK\x03\x04": "a zip archive (unzip it first)", b"PK\x05\x06": "an empty zip archive",
               b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive (extract it first)",
               b"PAR1": "a parquet file (already a trace? python -m traces.info reads one)"}
TAR_MAGIC_OFFSET = 257  # POSIX tar puts 'ustar' here in the first header block


def _refuse_containers(path: Path, head: bytes, expected: str) -> None:
    """TraceError for an archive or a parquet file given as a source; a tar archive is recognised inside gzip, zstd,
    bz2 or xz too (a .tar.gz was read as a CSV whose line 4 had '1 fields')."""
    kind = next((what for magic, what in _CONTAINERS.items() if head.startswith(magic)), None)
    if kind is None:
        try:
            with open_binary(path) as handle:
                block = handle.read(TAR_MAGIC_OFFSET + 5)
        except READ_ERRORS:  # a corrupt compressed file: the reader names it
            return
        if block[TAR_MAGIC_OFFSET:] == b"ustar":
            kind = "a tar archive (extract it first: tar xf)"
    if kind:
        raise TraceError(f"{path}: cannot read: {kind}; expected {expected}")


def read_csv_text(path: Path, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> pl.DataFrame:
    """All columns as strings; raises TraceError for an unreadable file or missing columns."""
    check_source_file(path, "a CSV file")
    _refuse_json(path)
    try:
        source = _polars_source(path)
    except READ_ERRORS as exc:  # a corrupt bz2'd or xz'd file, decompressed here
        raise TraceError(read_error(path, exc)) from None
    _check_line_endings(path, source)
    try:
        frame = pl.read_csv(source, infer_schema=False, has_header=True)
    except (pl.exceptions.PolarsError, OSError, UnicodeDecodeError) as exc:
        reason = _polars_reason(exc)
        if "utf-8" in reason.lower():  # polars names no line: 'invalid utf-8 sequence'
            raise TraceError(not_utf8_error(path) or f"{path}: not a readable CSV file ({reason})") from None
        if reason == "empty CSV":
            raise TraceError(f"{path}: the file is empty; expected a CSV file with a header line") from None
        # polars names no line for a ragged row, an open quote or a quote inside an unquoted field (which the csv
        # module reads as a literal character, so it finds nothing: the error was "CSV malformed: expected 0 rows,
        # actual 1 rows, in chunk starting at row_offset 0", naming neither the line nor what was wrong).
        where = _first_malformed_line(path) or _first_stray_quote_or_cr(path)
        if where:
            raise TraceError(f"{path}: {where}") from None
        raise TraceError(f"{path}: not a readable CSV file ({reason})") from None
    frame = _drop_blank_lines(path, _strip_header(path, frame))
    if frame.height and frame[frame.columns[-1]].null_count():  # an empty last field, or a row cut short?
        where = _first_malformed_line(path)
        if where:
            raise TraceError(f"{path}: {where}")
    missing = [name for name in required if name not in frame.columns]
    if missing:
        raise TraceError(
            f"{path}: missing column(s) {', '.join(repr(m) for m in missing)} in the header; "
            f"found {shown(frame.columns, 300)}{_separator_hint(frame.columns)}; expected {', '.join(required)}"
            + (f" (and optionally {', '.join(optional)})" if optional else "")
        )
    if frame.height == 0:
        raise TraceError(f"{path}: no data rows after the header; expected at least one request")
    return frame.with_columns(pl.col(name).str.strip_chars() for name in frame.columns)


def _refuse_json(path: Path) -> None:
    """TraceError for a JSON source given to a CSV format: polars read its first line as a header, and the error named
    a later line's field count ('line 2: 75 fields; expected 82')."""
    try:
        with open_text(path) as handle:
            first = handle.read(1024).lstrip()[:1]
    except READ_ERRORS:  # unreadable as text: the CSV reader names why, and the line
        return
    if first in ("{", "["):
        raise TraceError(f"{path}: cannot read: JSON, not CSV (it starts with {first!r}); expected a CSV file with a "
                         "header line")


def _separator_hint(columns: list[str]) -> str:
    """' (its fields are separated by ';', not commas)' for a header read as one column holding another separator
    (spreadsheets in many locales save CSV with semicolons), else ''."""
    if len(columns) != 1:
        return ""
    separator = next((sep for sep in (";", "\t", "|") if sep in columns[0]), None)
    return f" (its fields are separated by {separator!r}, not commas)" if separator else ""


LINE_ENDING_PROBE_BYTES = 1 << 16


def _check_line_endings(path: Path, source: Path | bytes) -> None:
    """TraceError for a CSV whose lines end in a bare carriage return (classic Mac OS, some exports): polars read
    the whole file as one header line, and the error named a column repeated or missing, not the line endings.
    A gzip'd or zstd'd file (which polars reads itself) is looked at decompressed: its compressed bytes held a CR and
    no LF often enough that a gzip'd CSV of LF lines was refused as one of CR lines."""
    if isinstance(source, bytes):
        head = source[:LINE_ENDING_PROBE_BYTES]
    else:
        try:
            with open_binary(source) as handle:
                head = handle.read(LINE_ENDING_PROBE_BYTES)
        except READ_ERRORS:  # a corrupt compressed file: polars' reader names it
            return
    if b"\r" in head.rstrip(b"\r") and b"\n" not in head:
        raise TraceError(f"{path}: its lines end in a bare carriage return (CR); expected LF or CRLF line endings "
                         "(tr '\\r' '\\n' converts it)")


def _polars_source(path: Path) -> Path | bytes:
    """What polars' CSV reader is given: the file, or its bytes decompressed where polars cannot undo the
    compression itself (bz2 and xz were 'invalid utf-8 sequence')."""
    if compression_of(path) in (None, *_POLARS_READS):
        return path
    with open_binary(path) as handle:
        return handle.read()


def _polars_reason(exc: Exception) -> str:
    """polars' message on one line, without its advice on reader options (which are ours to set, not the user's)."""
    reason = one_line(exc)
    for advice in (" Consider setting", " You might want to try"):
        reason = reason.split(advice)[0]
    return reason[:200] + "..." if len(reason) > 200 else reason


def _first_malformed_line(path: Path) -> str | None:
    """'line N: ...' for the first record whose field count differs from the header's or whose quote never closes;
    None if there is none. The csv module is slow, so this runs only once polars has seen a problem."""
    start, width = 1, None
    try:
        with open_text(path, newline="") as handle:
            reader = csv.reader(handle, strict=True)
            for row in reader:
                if width is None:
                    width = len(row) or None  # blank lines before the header are no header
                elif row and len(row) != width:
                    return f"line {start}: {len(row)} fields; expected {width}, as in the header"
                start = reader.line_num + 1
    except csv.Error as exc:
        problem = "a quoted field is never closed" if "end of data" in str(exc) else str(exc)
        return f"line {start}: {problem}; expected a CSV record of {width} fields"
    except READ_ERRORS:
        return None
    return None


def _first_stray_quote_or_cr(path: Path) -> str | None:
    """'line N: ...' for the first quote inside a field that does not open with one (`Chat"GPT`), or for the first bare
    carriage return (CR) that ends a record in the middle of a file of LF lines; None if there is neither. polars
    refuses both (a stray quote opens a quoted span that runs on into the next lines; a bare CR is no line end to it,
    so two records read as one with too many fields) where the csv module reads the quote as a character and the CR
    as a line end, so _first_malformed_line finds nothing. Lines are counted by their LF; lines without a quote are
    skipped whole; only errors ask."""
    in_quotes, record_line, field, field_start, closed = False, 1, 1, True, False
    line_no, bare_cr = 1, None  # bare_cr: the line of a CR that ended the last piece read, unless an LF follows
    try:
        with open_text(path, newline="") as handle:  # newline="": a piece ends at LF, CRLF or a CR alone
            for piece in handle:
                if bare_cr is not None and piece not in ("\n", "\r\n", "\r"):  # CR CR LF is a line end, not text
                    return (f"line {bare_cr}: a bare carriage return (CR) ends a record in the middle of the line; "
                            "expected LF or CRLF line endings throughout (tr '\\r' '\\n' makes every CR a line end; "
                            "the blank lines that leaves are skipped)")
                bare_cr = None
                if not in_quotes:  # a new record (a quoted field may hold line breaks)
                    record_line, field, field_start, closed = line_no, 1, True, False
                for char in piece if '"' in piece or in_quotes else ():
                    if in_quotes:
                        if char == '"':
                            in_quotes, closed = False, True
                    elif char == '"':
                        if not (field_start or closed):  # closed: a doubled quote ("") inside a quoted field
                            return (f"line {record_line}: field {field} holds a quote (\") inside a value that does "
                                    "not start with one; expected a value without quotes, or one enclosed in quotes "
                                    "with each inner quote doubled (\"\")")
                        in_quotes, field_start, closed = True, False, False
                    elif char == ",":
                        field, field_start, closed = field + 1, True, False
                    elif char not in "\r\n":
                        field_start, closed = False, False
                if piece.endswith("\r") and not in_quotes:
                    bare_cr = line_no
                line_no += piece.endswith("\n")
    except READ_ERRORS:
        return None
    return None


def _strip_header(path: Path, frame: pl.DataFrame) -> pl.DataFrame:
    """Column names without surrounding blanks: a file with CR CR LF line ends (CRLF written again on Windows)
    leaves a carriage return on the last name, which then matched no column. A name given twice, as it is or
    once blanks are stripped, is refused: which of the columns holds the data is unknown (polars renames an exact
    repeat NAME_duplicated_0)."""
    names = [name.split("_duplicated_")[0].strip() for name in frame.columns]
    repeated = [name for i, name in enumerate(names) if name in names[:i]]
    if repeated:
        raise TraceError(f"{path}: the header names column {shown(repr(repeated[0]))} more than once; expected each "
                         "column once")
    return frame.rename(dict(zip(frame.columns, names)))


def _first_bad(path: Path, text: pl.Series, parsed: pl.Series, field: str, expected: str) -> None:
    """Raise for the first row whose text is missing or did not parse."""
    bad = (text.is_null() | parsed.is_null()).arg_true()
    if len(bad):
        row = int(bad[0])
        raise TraceError(f"{path}: line {line_of_row(path, row)}: field {field!r} is {field_shown(text[row])}; "
                         f"expected {expected}")


def field_shown(value: str | None) -> str:
    """A CSV field's text as an error quotes it: "empty", or its repr cut short (a field of megabytes, a lost line
    break, was quoted whole, an error line of megabytes)."""
    return "empty" if value is None or value == "" else shown(repr(value))


def int_column(path: Path, frame: pl.DataFrame, field: str, minimum: int = 0) -> pl.Series:
    """Field as Int64; whole-number floats such as '12.0' are accepted; must be >= minimum."""
    text = frame[field]
    as_float = text.cast(pl.Float64, strict=False)
    whole = as_float.is_finite() & (as_float == as_float.floor())
    parsed = pl.Series(field, as_float).set(~whole.fill_null(False), None)
    _first_bad(path, text, parsed, field, "an integer")
    exact = text.cast(pl.Int64, strict=False)  # digits parse exactly; a float keeps only 53 bits of them
    huge = (exact.is_null() & (parsed.abs() >= 2.0**63)).arg_true()  # beyond int64: no token count is that large
    if len(huge):
        row = int(huge[0])
        raise TraceError(f"{path}: line {line_of_row(path, row)}: field {field!r} is {shown(text[row])}; expected an "
                         "integer below 2**63")
    # Not strict: the float of an exact 2**63 - 1 rounds to 2**63, and the strict cast refused the whole column (an
    # InvalidOperationError traceback) though only the rows without exact digits take its values, all refused above
    # where beyond int64.
    values = exact.fill_null(parsed.cast(pl.Int64, strict=False)).alias(field)
    low = (values < minimum).arg_true()
    if len(low):
        row = int(low[0])
        raise TraceError(
            f"{path}: line {line_of_row(path, row)}: field {field!r} is {values[row]}; expected an integer >= {minimum}"
        )
    return values


def float_column(path: Path, frame: pl.DataFrame, field: str, minimum: float | None = None,
                 maximum: float | None = None, optional: bool = False) -> pl.Series:
    """Field as finite Float64, optionally from minimum to maximum (a bound checked here names the line; the
    trace's own check after the conversion could name only the converted row). With `optional`, an empty field is
    null rather than an error (a measurement some rows lack)."""
    text = frame[field]
    parsed = text.cast(pl.Float64, strict=False)
    parsed = parsed.set(~parsed.is_finite().fill_null(False), None)
    if optional:
        blank = (text.is_null() | (text == "")).fill_null(True)
        _first_bad(path, text.set(blank, "0"), parsed.set(blank, 0.0), field, "a finite number or nothing")
    else:
        _first_bad(path, text, parsed, field, "a finite number")
    checks = [(parsed < minimum, f">= {minimum}")] if minimum is not None else []
    checks += [(parsed > maximum, f"<= {maximum:g}")] if maximum is not None else []
    for outside, bound in checks:
        rows = outside.arg_true()
        if len(rows):
            row = int(rows[0])
            raise TraceError(
                f"{path}: line {line_of_row(path, row)}: field {field!r} is {parsed[row]}; expected a number {bound}"
            )
    return parsed
