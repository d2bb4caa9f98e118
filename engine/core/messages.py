"""Error text for a one-line message (torch-free): the engine, the server, the trace tools and the analysis CLIs
quote other libraries' messages (transformers', torch's, safetensors', Ray's), which span lines."""

from __future__ import annotations


def one_line(text: object) -> str:
    """``text`` (an exception too) with its line breaks and runs of whitespace as single spaces."""
    return " ".join(str(text).split())


def exception_line(exc: BaseException, limit_chars: int = 400) -> str:
    """``exc`` as one line: its type and its message's words, at most ``limit_chars`` characters."""
    text = one_line(f"{type(exc).__name__}: {exc}")
    return text if len(text) <= limit_chars else text[:limit_chars - 3] + "..."
