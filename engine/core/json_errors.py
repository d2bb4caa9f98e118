"""Why ``json.loads`` refused a text, in words (torch-free; the server, the trace converters and the analysis
tools all read JSON a user handed them, and each message must name the file or request, not echo Python's)."""

from __future__ import annotations

import json
import sys


def json_problem(exc: BaseException) -> str:
    """The reason, for a message that names its file or request. Besides JSONDecodeError, ``json.loads`` raises a
    UnicodeDecodeError for bytes that are not UTF-8 and a plain ValueError for an integer longer than Python converts
    (``sys.get_int_max_str_digits()``, 4300 digits), whose own message advised ``sys.set_int_max_str_digits()`` and
    named no file; nesting thousands deep is a RecursionError."""
    if isinstance(exc, RecursionError):
        return "arrays or objects nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1].hex()} at {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


_JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
                    type(None): "null"}


def json_type_name(value: object) -> str:
    """What a parsed JSON value is, in JSON's words (a top-level ``null`` was reported as "a JSON NoneType")."""
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
