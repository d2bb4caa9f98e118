"""engine.core.messages: other libraries' multi-line messages quoted on one bounded line."""

from __future__ import annotations

from engine.core.messages import exception_line, one_line


def test_one_line_collapses_whitespace_and_cuts_with_an_ellipsis() -> None:
    assert one_line("a\n  b\t c\n") == "a b c"
    assert one_line(ValueError("x\ny")) == "x y"
    assert one_line("abcdef", 6) == "abcdef"
    assert one_line("abcdefg", 6) == "abc..."
    assert len(one_line("word " * 200, 300)) == 300


def test_exception_line_names_the_type_and_is_unbounded_only_when_asked() -> None:
    exc = RuntimeError("first line\nsecond " + "x" * 500)
    assert exception_line(exc).startswith("RuntimeError: first line second ")
    assert len(exception_line(exc)) == 400 and exception_line(exc).endswith("...")
    assert exception_line(exc, None) == "RuntimeError: first line second " + "x" * 500
