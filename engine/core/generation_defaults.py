"""The model's default sampling parameters, read from its generation_config.json as vLLM does (torch-free).

vLLM (since 0.8) takes temperature, top_p, top_k and max_new_tokens (as max_tokens) from the model's
generation_config.json as the defaults of every request that leaves them out (``--generation-config auto``, its
default); ``vllm`` ignores the file, and a folder reads that folder's file instead. Without this a Qwen3 request that
sets no temperature sampled at 1.0 here and at 0.6 (top_p 0.95, top_k 20) under vLLM: the same request, other text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.core.messages import escape_controls, one_line
from engine.core.model_config import read_generation_config
from engine.core.sampling_params import SamplingParams, field_problem

GENERATION_CONFIG_MODES = ("auto", "vllm")
GENERATION_CONFIG_FILE = "generation_config.json"
# The logger of engine.LLM's lines on these defaults; engine.serve prints them itself, before its engine process starts.
LOGGER_NAME = "engine.generation_config"

# The fields of generation_config.json that vLLM takes as defaults, by the request field each sets (vLLM's
# ModelConfig.get_diff_sampling_param). It ignores the rest (do_sample, max_length, ...), and so does this engine.
_APPLIED = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_new_tokens": "max_tokens"}
# Fields vLLM takes too that this engine does not implement, with the values that ask for nothing: any other value is
# a note at start-up (the request field is refused with a 400, but the model's default cannot be refused per request).
_NOT_APPLIED = {"repetition_penalty": (1, 1.0), "min_p": (0, 0.0)}
_INTEGER_FIELDS = ("top_k", "max_tokens")


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults of requests that leave a field out: vLLM's own (temperature 1, top_p 1, top_k off) unless
    ``source``, a generation_config.json, set some (``from_file`` names them, as request fields)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None  # None: the request's own default (16 offline, the room the prompt leaves online)
    source: str | None = None
    from_file: tuple[str, ...] = ()
    not_applied: tuple[tuple[str, object], ...] = ()  # the file's fields this engine ignores, with their values

    def sampling_params(self, **given: object) -> SamplingParams:
        """A SamplingParams of ``given`` over these defaults; a field given as None counts as left out. This is
        ``LLM.get_default_sampling_params()`` without arguments (max_tokens 16 where the file sets none, as vLLM)."""
        fields = {name: getattr(self, name) for name in self.from_file}
        fields.update({name: value for name, value in given.items() if value is not None})
        return SamplingParams(**fields)

    def as_dict(self) -> dict[str, object]:
        """The defaults the file set, by request field (what vLLM logs as "Using default sampling params")."""
        return {name: getattr(self, name) for name in self.from_file}

    def report(self, ignore_hint: str) -> list[str]:
        """The lines that say what the file set and what of it is not applied (none when it set nothing);
        ``ignore_hint`` says how to run without it (an option, or a keyword of LLM)."""
        lines = []
        source = escape_controls(self.source)  # a model folder's name may hold a newline or an ANSI escape
        if self.from_file:
            values = ", ".join(f"{name}={value}" for name, value in self.as_dict().items())
            lines.append(f"{source}: the model's generation config sets the default sampling parameters of "
                         f"requests that leave them out: {values} (as vLLM does; {ignore_hint} ignores the file)")
        if self.not_applied:
            values = ", ".join(f"{name}={one_line(repr(value), 40)}" for name, value in self.not_applied)
            lines.append(f"note: {source}: {values} not applied: the engine does not implement "
                         f"{'it' if len(self.not_applied) == 1 else 'them'} (vLLM would)")
        return lines


def read_generation_defaults(model_dir: str | Path, generation_config: str = "auto", *,
                             option: str = "generation_config") -> GenerationDefaults:
    """The defaults ``generation_config`` asks for: 'auto' (the model folder's generation_config.json, none without
    one), 'vllm' (none) or a folder holding a generation_config.json. A bad value in the file is one line naming the
    file and the field, here at start-up rather than in every request; ``option`` names the setting in errors."""
    source = generation_config_file(model_dir, generation_config, option)
    if source is None:
        return GenerationDefaults()
    return defaults_from_dict(read_generation_config(source), str(source))


def generation_config_file(model_dir: str | Path, generation_config: str, option: str) -> Path | None:
    """The generation_config.json that ``generation_config`` names (None: no defaults to read)."""
    if isinstance(generation_config, os.PathLike):  # as LLM(model=Path(...)): a Path was refused as no folder
        generation_config = os.fspath(generation_config)
    if not isinstance(generation_config, str) or not generation_config.strip():
        raise ValueError(f"{option} must be 'auto', 'vllm' or a folder holding {GENERATION_CONFIG_FILE}, "
                         f"got {generation_config!r}")
    if generation_config == "vllm":
        return None
    if generation_config == "auto":
        source = Path(model_dir) / GENERATION_CONFIG_FILE
        return source if source.is_file() else None
    folder = Path(generation_config)
    source = folder / GENERATION_CONFIG_FILE
    try:
        if source.is_file():
            return source
        # A folder that was asked for by name and holds no file is a mistake, not "no defaults" (vLLM said nothing).
        why = ("is a file; pass the folder holding it" if folder.is_file() else
               f"has no {GENERATION_CONFIG_FILE}" if folder.is_dir() else "does not exist")
    except OSError as exc:  # a name past 255 bytes: is_file() raises it (engine.serve printed a traceback)
        why = f"cannot be read ({exc.strerror or exc})"
    raise ValueError(f"{option} {generation_config!r} {why}; expected 'auto', 'vllm' or a folder holding "
                     f"{GENERATION_CONFIG_FILE}")


def defaults_from_dict(config: dict, source: str) -> GenerationDefaults:
    """The defaults of a generation_config.json's contents; a null counts as absent, as in vLLM."""
    values = {field: _checked(config[key], key, field, source)
              for key, field in _APPLIED.items() if config.get(key) is not None}
    not_applied = tuple((key, config[key]) for key, neutral in _NOT_APPLIED.items()
                        if config.get(key) is not None and config[key] not in neutral)
    return GenerationDefaults(**values, source=source, from_file=tuple(values), not_applied=not_applied)


def _checked(value: object, key: str, field: str, source: str) -> object:
    """``value`` as a request's ``field`` takes it, checked by SamplingParams itself: the file cannot hold a default
    that every request would then be refused for. A whole float (20.0) counts as the integer, as config.json's sizes
    do."""
    if field in _INTEGER_FIELDS and isinstance(value, float) and value.is_integer():
        value = int(value)
    problem = field_problem(field, value)
    if problem is not None:
        rule = problem.rsplit(", got ", 1)[0]
        raise ValueError(f"{source}: {key!r} is {one_line(repr(value), 60)}; a request's {field} {rule}")
    return value
