"""Command-line options generated from a config's fields (``engine.core.config.option``), so no CLI
restates a default: ``--field-name`` (or the field's ``flag``), typed from its annotation, with its
help and choices; a boolean that defaults to true becomes a ``--no-...`` switch. The config's own
validator checks the values when ``build_config`` makes it.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable
from typing import NoReturn

from engine.core.config import ConfigError
from engine.core.messages import escape_controls


class _StoreOnce(argparse._StoreAction):
    """An option that takes a value, given at most once: argparse keeps the last of two, so ``--slo ttft_p90=1s
    --slo tpot_p90=100ms`` judged by the TPOT limit alone, dropping the TTFT one without a word (lists go in one
    value, comma-separated, where an option takes one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        given = getattr(parser, "_options_given", None)
        if option_string is not None and given is not None:
            if self.dest in given:
                first = given[self.dest]
                named = first if first == option_string else f"{first} ({option_string})"
                parser.error(f"{named} is given twice; give it once (only the last value would count)")
            given[self.dest] = option_string
        super().__call__(parser, namespace, values, option_string)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, as every other bad input is: argparse printed the whole
    usage (some 25 lines) above 'invalid int value: 'nan'', burying the line that says what was wrong. An option
    that takes a value is refused when given twice (``_StoreOnce``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The default action of this parser and of its argument groups (they share its registry).
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)
        self._options_given: dict[str, str] | None = None

    def parse_known_args(self, args=None, namespace=None):
        outer = self._options_given
        self._options_given = {}  # dest -> the flag that set it, for this parse
        try:
            parsed, extras = super().parse_known_args(args, namespace)
        finally:
            self._options_given = outer
        self._refuse_empty_positionals(parsed)
        return parsed, extras

    def _refuse_empty_positionals(self, parsed: argparse.Namespace) -> None:
        """An empty positional argument (a path from an unset shell variable) is Path(""), the current folder: it
        was refused as ".: is a directory", a folder nobody typed, or read as the run folder one stood in."""
        for action in self._actions:
            if action.option_strings or action.dest == argparse.SUPPRESS:
                continue
            value = getattr(parsed, action.dest, None)
            if value == "" or (isinstance(value, list) and "" in value):
                self.error(f"argument {action.metavar or action.dest}: is empty; expected a path or a value")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (--help lists the options)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        """Exit with ``message`` kept to one line: a path it names (--out, a trace) may hold a newline, which printed
        the error over two lines; control characters are escaped as repr writes them (the final newline kept)."""
        if message:
            ending = "\n" if message.endswith("\n") else ""
            message = escape_controls(message.removesuffix("\n")) + ending
        super().exit(status, message)


def nonempty(text: str) -> str:
    """argparse type of a path option: an empty one is Path(""), the current folder, which nobody typed."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name a file")
    return text


def config_fields(cls, names: Iterable[str] | None = None) -> list[dataclasses.Field]:
    """The option fields of ``cls``: all of them, or those in ``names`` in that order."""
    by_name = {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata}
    return list(by_name.values()) if names is None else [by_name[n] for n in names]


def field_names(cls) -> list[str]:
    return [f.name for f in config_fields(cls)]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_config_arguments(parser, cls, names: Iterable[str] | None = None, *,
                         types: dict[str, Callable[[str], object]] | None = None) -> None:
    """One option per field of ``cls`` (or per name in ``names``) on ``parser`` (or an argument group);
    ``types`` overrides a field's parser, e.g. with a comma list in sweeps."""
    for f in config_fields(cls, names):
        flag, help_text = flag_of(f), f.metadata["help"]
        if str(f.type) == "bool":
            parser.add_argument(flag, dest=f.name, action="store_false" if f.default else "store_true", help=help_text)
            continue
        kind = ((types or {}).get(f.name) or f.metadata.get("parse")
                or (float if "float" in str(f.type) else int if "int" in str(f.type) else str))
        choices = f.metadata.get("choices") if f.name not in (types or {}) else None
        parser.add_argument(
            flag, dest=f.name, type=kind, default=f.default, choices=list(choices) if choices else None,
            metavar=None if choices else flag.lstrip("-").replace("-", "_").upper(),
            help=help_text + ("" if f.default is None else " (default: %(default)s)"),
        )


def build_config(cls, args: argparse.Namespace):
    """``cls`` from parsed options; a bad value's error names the option as typed (``--replicas: ...``)."""
    try:
        return cls(**{f.name: getattr(args, f.name) for f in config_fields(cls) if hasattr(args, f.name)})
    except ConfigError as exc:
        flags = {f.name: flag_of(f) for f in config_fields(cls)}
        if exc.field not in flags:
            raise
        raise ValueError(f"{flags[exc.field]}: {exc}") from None
