"""Per-request sampling and stopping options (torch-free: the scheduler reads the stop rules)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace

# Below this temperature sampling is greedy, as in vLLM: logits / 1e-40 overflow float32 to inf, and the draw
# among several infinite logits is not the largest logit.
GREEDY_BELOW_TEMPERATURE = 1e-5
# The sampler divides float32 logits by the temperature: a larger one is inf there, and logits / inf are 0 (or NaN),
# a uniform draw that ignores top_k and top_p.
MAX_TEMPERATURE = 3.4e38
_NO_STOP_IDS: frozenset[int] = frozenset()
# Each of a prompt's n samples is a request of its own, built and queued before the first step (~40 us each on the
# CPU): n=10**12 was taken, and generate() built requests until memory ran out. The server refuses more than its
# queue holds (--max-waiting-requests, 4,096 by default) before this bound is reached.
MAX_N = 65_536


# Exact float/int first: the ABC checks behind them (numpy scalars) cost ~30k instructions per request in the
# simulator, 7 % of simulate() on the Azure trace, where every request builds its params.
def _is_real(value: object) -> bool:
    return type(value) is float or type(value) is int or (isinstance(value, numbers.Real)
                                                          and not isinstance(value, bool))


def _is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool))


def _is_bool(value: object) -> bool:
    """A Python bool or a numpy one (np.True_, a mask's element), which is no bool subclass: ignore_eos=np.True_ was
    refused as "must be True or False, got np.True_"."""
    return type(value) is bool or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Names follow vLLM. ``temperature == 0`` (or below 1e-5) means greedy; ``top_k`` -1 or 0 and ``top_p == 1``
    disable those filters. ``n``, ``stop`` and ``include_stop_str_in_output`` are the front end's (engine.LLM, the
    server): the engine runs each of the n samples as a request of its own, and stop strings are found in the text
    (engine.core.detokenizer), which the engine does not make. ``min_tokens``: the first that many tokens never stop
    the request (``may_stop``), as in vLLM: the sampler masks the eos and stop_token_ids tokens (the eos even with
    ignore_eos, as vLLM does) and no stop string is found in their text."""

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] | tuple[int, ...] | None = ()  # any ints (None: none); kept as a frozenset
    seed: int | None = None
    n: int = 1
    stop: str | tuple[str, ...] | None = ()  # a string or any strings (None: none); kept as a tuple
    include_stop_str_in_output: bool = False
    min_tokens: int = 0  # last: code passing the fields above by position keeps working

    def __post_init__(self) -> None:
        # A wrong type is a ValueError naming the field, as a wrong value is: compared with a float, "0.5" raised a
        # TypeError, and True passed as max_tokens 1 or seed 1.
        if not (_is_real(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"SamplingParams.temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got "
                             f"{self.temperature!r}")  # 'a finite number >= 0' refused 1e308, which is one
        if self.temperature < GREEDY_BELOW_TEMPERATURE:
            object.__setattr__(self, "temperature", 0.0)
        if not (_is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k):
            raise ValueError(f"SamplingParams.top_k must be an int (<= 0 disables it), got {self.top_k!r}")
        if self.top_k < -1:  # vLLM and our server refuse these; -5 was taken as 'off' without a word
            raise ValueError(f"SamplingParams.top_k must be -1 or 0 (off) or >= 1, got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not (_is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_tokens):
            raise ValueError(f"SamplingParams.min_tokens must be an int from 0 to max_tokens ({self.max_tokens}), got "
                             f"{self.min_tokens!r}")
        if _is_int(self.seed) and self.seed == -1:  # vLLM's "no seed": code passing it through was refused
            object.__setattr__(self, "seed", None)
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < 2**64):
            raise ValueError(f"SamplingParams.seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not _is_bool(self.ignore_eos):
            raise ValueError(f"SamplingParams.ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not (_is_int(self.n) and 1 <= self.n <= MAX_N):
            raise ValueError(f"SamplingParams.n must be an int from 1 to {MAX_N} (each sample is a request of its "
                             f"own), got {self.n!r}")
        if not _is_bool(self.include_stop_str_in_output):
            raise ValueError(f"SamplingParams.include_stop_str_in_output must be True or False, got "
                             f"{self.include_stop_str_in_output!r}")
        self._as_python_numbers()
        self._set_stop_token_ids()
        self._set_stop()

    def _as_python_numbers(self) -> None:
        """Numpy scalars (and other numbers.Real) as Python ints and floats: a seed of np.int8(5) failed its request in
        the sampler (seed & 0xFFFFFFFF overflowed int8), and max_tokens np.uint64(2**64 - 1) wrapped around when added
        to the prompt's length, a request of one token finished as "length"."""
        for name, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("max_tokens", int),
                           ("seed", int), ("n", int), ("min_tokens", int)):
            value = getattr(self, name)
            if type(value) is not int and type(value) is not float and value is not None:
                object.__setattr__(self, name, kind(value))
        for name in ("ignore_eos", "include_stop_str_in_output"):  # np.True_ as True: its JSON and identity are bool's
            if type(getattr(self, name)) is not bool:
                object.__setattr__(self, name, bool(getattr(self, name)))

    def _set_stop_token_ids(self) -> None:
        """Kept as a frozenset: each generated token is looked up in it, and a request's 100,000 ids in a tuple cost
        that many comparisons per token in the engine's loop. A string or a lone int (iterated as characters, or a
        TypeError) is refused: ids that can never match would stop nothing without a word."""
        ids = self.stop_token_ids
        if isinstance(ids, frozenset):
            return
        # () is the default, on every request (== () broadcast a numpy array); None is vLLM's default
        # (stop_token_ids: list[int] | None = None): code passing it through was refused.
        if ids is None or (type(ids) is tuple and not ids):
            object.__setattr__(self, "stop_token_ids", _NO_STOP_IDS)
            return
        # A dict iterates its keys: {5: "eos"} stopped on 5 and {"5": ...} was refused as the string '5' in it
        if isinstance(ids, (str, bytes, Mapping)) or not hasattr(ids, "__iter__"):
            raise ValueError(f"SamplingParams.stop_token_ids must be a sequence of ints, got {ids!r}")
        try:
            ids = tuple(ids)
        except TypeError:  # a 0-d numpy array or torch tensor has __iter__ but iterates nothing: was that TypeError
            raise ValueError(f"SamplingParams.stop_token_ids must be a sequence of ints, got {ids!r}") from None
        bad = next((t for t in ids if not _is_int(t)), None)
        if bad is not None:
            raise ValueError(f"SamplingParams.stop_token_ids must be a sequence of ints, got {bad!r} in it")
        object.__setattr__(self, "stop_token_ids", frozenset(int(t) for t in ids))

    def _set_stop(self) -> None:
        """Kept as a tuple of strings: one string is one stop string (vLLM's ``stop="\\n"``), not its characters. An
        empty string, or one holding half a surrogate pair, can never end a text the way it was meant to."""
        stop = self.stop
        if type(stop) is tuple and not stop:  # the default, on every request
            return
        if stop is None:  # vLLM's default
            object.__setattr__(self, "stop", ())
            return
        if isinstance(stop, str):
            stop = (stop,)
        elif isinstance(stop, (bytes, Mapping)) or not hasattr(stop, "__iter__"):  # (a dict: its keys, silently)
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {stop!r}")
        try:
            stop = tuple(stop)
        except TypeError:  # a 0-d numpy array has __iter__ but iterates nothing
            raise ValueError(f"SamplingParams.stop must be a string or a list of strings, got {stop!r}") from None
        bad = next((s for s in stop if not isinstance(s, str) or not s), None)
        if bad is not None:
            raise ValueError(f"SamplingParams.stop must hold non-empty strings, got {bad!r} in it")
        for text in stop:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"SamplingParams.stop holds an unpaired surrogate (U+{ord(text[exc.start]):04X}); "
                                 "expected Unicode text") from None
        object.__setattr__(self, "stop", stop)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    def sample(self, index: int) -> SamplingParams:
        """The options of sample ``index`` of the ``n``: one request of its own (n=1), whose seed, if any, is the
        request's plus ``index``: the samples draw differently, each reproducibly (the server's n choices too)."""
        if index == 0 and self.n == 1:  # itself: a prompt's only sample (every request but n's) is not validated again
            return self
        seed = None if self.seed is None else (self.seed + index) % 2**64
        return replace(self, n=1, seed=seed)


def may_stop(num_generated: int, min_tokens: int) -> bool:
    """Whether a request's ``num_generated``-th token (counted from 1) may stop it, an eos, a stop token or the end of
    a stop string, under its ``min_tokens``: the one rule of the scheduler, the sampler's mask and the detokenizer."""
    return num_generated > min_tokens


def field_problem(field: str, value: object) -> str | None:
    """Why a request could not take ``value`` as its ``field`` (SamplingParams' own rule, without the field's name:
    'must be in (0, 1], got 0.0'), or None: for options and files that set a field of every request, checked before
    any request is built."""
    try:
        SamplingParams(**{field: value})
    except ValueError as exc:
        return str(exc).removeprefix(f"SamplingParams.{field} ")
    return None


def sampling_mode(temperature: float, top_k: int, top_p: float, vocab_size: int) -> str:
    """How requests that all ask these options sample, as the engine's sampler tells them apart (SamplingRows): 'greedy'
    (an argmax: a temperature below GREEDY_BELOW_TEMPERATURE), 'filters' (top-k or top-p before the draw; a top_k
    past the vocabulary keeps every token and is off) or 'temperature' (one draw over the whole vocabulary). The
    simulator prices each as its profile measured it."""
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return "greedy"
    return "filters" if 0 < top_k < vocab_size or top_p < 1.0 else "temperature"


def samples_argmax(temperature: float, top_k: int) -> bool:
    """Whether a request with these options always samples its most likely token: greedy, or top_k=1, which leaves
    the draw one token (the engine's sampler: an argmax under any temperature). Two requests of one prompt then
    continue alike, and their generated KV blocks hash alike in the prefix cache; the simulator's runner gives them
    one token (CostModelRunner.distinct_first_tokens off) as it gives greedy ones."""
    return temperature < GREEDY_BELOW_TEMPERATURE or top_k == 1
