"""engine.core.messages: other libraries' multi-line messages quoted on one bounded line."""

from __future__ import annotations

from engine.core.messages import escape_controls, exception_line, one_line


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


def test_escape_controls_writes_control_and_bidi_characters_as_repr_and_keeps_other_text() -> None:
    # A right-to-left override in a run's name printed "run<RLO>exe.txt" as "runtxt.exe" on a terminal.
    assert escape_controls("run\u202eexe.txt") == "run\\u202eexe.txt"
    assert escape_controls("a\u2066b\u2069c\x1b[1m\n") == "a\\u2066b\\u2069c\\x1b[1m\\n"
    assert escape_controls("é אב 😀 tab\tx") == "é אב 😀 tab\\tx"  # letters of any script stay; tab is a control
