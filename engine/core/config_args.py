"""Command-line options generated from a config dataclass's fields, so no CLI restates a default.

Each field made with ``engine.core.config.option`` becomes ``--field-name`` (or its ``flag``), typed
from its default, with its help text and choices; a boolean that defaults to true becomes a
``--no-...`` switch. Values are checked by the config's own validator when it is built.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable

from engine.core.config import ConfigError


def config_fields(cls, names: Iterable[str] | None = None) -> list[dataclasses.Field]:
    """The option fields of ``cls``: all of them, or those in ``names`` in that order."""
    by_name = {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata}
    return list(by_name.values()) if names is None else [by_name[n] for n in names]


def field_names(cls) -> list[str]:
    return [f.name for f in config_fields(cls)]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _value_type(f: dataclasses.Field) -> Callable[[str], object]:
    annotation = str(f.type)
    if "float" in annotation:
        return float
    if "int" in annotation:
        return int
    return str


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls,
    names: Iterable[str] | None = None,
    *,
    types: dict[str, Callable[[str], object]] | None = None,
) -> None:
    """One option per field of ``cls`` (or per name in ``names``); ``types`` overrides a field's parser
    (e.g. a comma list in sweeps)."""
    types = types or {}
    for f in config_fields(cls, names):
        flag = flag_of(f)
        help_text = f.metadata["help"]
        if f.type in (bool, "bool"):
            if f.default:  # the switch turns it off
                parser.add_argument(flag, dest=f.name, action="store_false", help=help_text)
            else:
                parser.add_argument(flag, dest=f.name, action="store_true", help=help_text)
            continue
        choices = f.metadata.get("choices")
        metavar = flag.lstrip("-").replace("-", "_").upper()
        default_text = "" if f.default is None else " (default: %(default)s)"
        if f.name in types:
            parser.add_argument(flag, dest=f.name, type=types[f.name], default=f.default, metavar=metavar,
                                help=help_text + default_text)
        elif choices:
            parser.add_argument(flag, dest=f.name, type=_value_type(f), default=f.default, choices=list(choices),
                                help=help_text + default_text)
        else:
            parser.add_argument(flag, dest=f.name, type=_value_type(f), default=f.default, metavar=metavar,
                                help=help_text + default_text)


def config_kwargs(cls, args: argparse.Namespace) -> dict[str, object]:
    """The values parsed by ``add_config_arguments`` for ``cls``, by field name."""
    return {f.name: getattr(args, f.name) for f in config_fields(cls) if hasattr(args, f.name)}


def build_config(cls, args: argparse.Namespace):
    """``cls`` from parsed options; a bad value's error names the option as typed (``--replicas: ...``)."""
    try:
        return cls(**config_kwargs(cls, args))
    except ConfigError as exc:
        if exc.field is None:
            raise
        flags = {f.name: flag_of(f) for f in config_fields(cls)}
        raise ValueError(f"{flags.get(exc.field, exc.field)}: {exc}") from None
