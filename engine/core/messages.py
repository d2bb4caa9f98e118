"""Error text for a one-line message (torch-free): the engine, the server, the trace tools and the analysis CLIs
quote other libraries' messages (transformers', torch's, safetensors', Ray's), which span lines."""

from __future__ import annotations

import unicodedata


def one_line(text: object, limit_chars: int | None = None) -> str:
    """``text`` (an exception too) with its line breaks and runs of whitespace as single spaces; with
    ``limit_chars``, cut to at most that many characters, ending in "..." where cut (an error body can be a whole
    HTML page)."""
    line = " ".join(str(text).split())
    if limit_chars is None or len(line) <= limit_chars:
        return line
    return line[:limit_chars - 3] + "..."


# The bidirectional embeddings, overrides and isolates (U+202A-202E, U+2066-2069): a name holding one reorders the
# text after it on a terminal or in a Markdown table ("Trojan source"), so a printed path or run name reads as another.
_BIDI_CONTROLS = frozenset(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]))


def escape_controls(text: object) -> str:
    """``text`` with its control characters escaped as repr writes them (a newline as \\n, a right-to-left override as
    \\u202e): a file name holding a newline, quoted in an error, printed that error over two lines."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" or c in _BIDI_CONTROLS else c for c in str(text))


def shown(value: object, limit_chars: int = 80) -> str:
    """``value`` as a one-line error quotes it: on one line, its control characters escaped, cut to at most
    ``limit_chars`` characters and then ending in "..." (an error cut a hand-edited list at 80 characters with no sign
    that it went on, and the part shown could read as the whole value)."""
    return one_line(escape_controls(value), limit_chars)


def exception_line(exc: BaseException, limit_chars: int | None = 400) -> str:
    """``exc`` as one line: its type and its message's words, at most ``limit_chars`` characters."""
    return one_line(f"{type(exc).__name__}: {exc}", limit_chars)


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 request``, ``2 requests``: a count with its noun in the number the count takes ("wrote 1 requests",
    "dropped 1 turns" read as typos). ``plural`` where adding an s is wrong."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def long_name_message(exc: OSError) -> str:
    """The one error of ``exc``, an OSError of a path with a name past the file system's limit (ENAMETOOLONG):
    the path, the reason and what was expected."""
    named = "" if exc.filename is None else f"{escape_controls(exc.filename)}: "
    return f"{named}{exc.strerror}; expected a path whose names are at most 255 bytes each (4096 in all)"
