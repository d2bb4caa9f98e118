"""The one exception type of the traces package.

Every problem with a trace file (unreadable, malformed, inconsistent) is raised as
`TraceError` so callers can catch one type; its message names the file, the row or
line, the column or field, and what was expected, so a user can fix the input
without reading this code.
"""

from __future__ import annotations


class TraceError(ValueError):
    """A trace file or trace table that cannot be used, with a precise reason."""


def describe_row(row: int, request_id: object | None = None) -> str:
    """Name a row the same way in every message: `row 17 (request_id 'abc')`."""
    if request_id is None:
        return f"row {row}"
    return f"row {row} (request_id {request_id!r})"


def row_error(source: str, row: int | None, request_id: object | None, column: str, problem: str) -> TraceError:
    """Build the standard message `SOURCE: row N (request_id X): column 'C' PROBLEM`."""
    where = f"{describe_row(row, request_id)}: " if row is not None else ""
    return TraceError(f"{source}: {where}column {column!r} {problem}")

