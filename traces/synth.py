"""Synthetic traces: `python -m traces.synth -o OUT.parquet --num-requests N --qps Q ...`.

Single-turn traces draw each request's prompt and output length independently. With
`--multi-turn`, requests come from chat sessions whose later prompts contain the whole
earlier conversation, written as `hash_ids` so prefix caching sees the reuse. Output is
a pure function of the arguments: the same command writes the same bytes.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from engine.core.config_args import OneLineErrorParser, nonempty
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.messages import counted, escape_controls
from traces.arrivals import arrival_times_s
from traces.files import refuse_to_replace
from traces.lengths import MAX_LENGTH, LengthDist, parse_length_dist
from traces.schema import Trace, save_trace
from traces.sessions import CUT_COLUMN, SessionConfig, build_sessions
from traces.summary import describe
from traces.validation import MAX_ARRIVAL_S, MAX_HASH_BLOCK_SIZE

MAX_REQUESTS = 2**32


@dataclass(frozen=True)
class SynthConfig:
    """Everything that determines a synthetic trace."""

    num_requests: int
    qps: float
    arrival_cv: float = 1.0  # 1 = Poisson
    prompt_dist: str = "sharegpt"  # per user message when multi_turn
    output_dist: str = "sharegpt"
    multi_turn: bool = False
    turns_dist: str = "sharegpt"
    think_time_s: float = 30.0
    think_time_cv: float = 1.0
    hash_block_size: int = 16
    max_context_tokens: int = 16384
    warmup_s: float | None = None  # None: 4 x mean turns x mean think time
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.num_requests <= MAX_REQUESTS:
            raise ValueError(f"num_requests must be an integer from 1 to {MAX_REQUESTS:,}, got {self.num_requests}")
        if not 0 < self.qps < math.inf or not 1.0 / self.qps < math.inf:
            raise ValueError(f"qps must be a finite number > 0, got {self.qps}")
        for name in ("arrival_cv", "think_time_cv"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} (a coefficient of variation) must be a finite number >= 0, "
                                 f"got {getattr(self, name)}")
        # A turn arrives its think time after the one before: past MAX_ARRIVAL_S no later turn can be in a trace, and
        # 1e308 with --warmup-s 0 overflowed the arrivals to inf (a numpy RuntimeWarning over two lines, exit 0).
        if not 0 < self.think_time_s <= MAX_ARRIVAL_S:
            raise ValueError(f"think_time_s must be a finite number > 0, at most {MAX_ARRIVAL_S:g} s, got "
                             f"{self.think_time_s}")
        if not 1 <= self.hash_block_size <= MAX_HASH_BLOCK_SIZE:  # 2**70: OverflowError
            raise ValueError(f"hash_block_size must be from 1 to {MAX_HASH_BLOCK_SIZE}, got {self.hash_block_size}")
        if not 2 <= self.max_context_tokens <= MAX_LENGTH:  # 10**20 was an OverflowError in the int64 cut arithmetic
            raise ValueError(f"max_context_tokens must be from 2 to 2**40, got {self.max_context_tokens}")
        if self.warmup_s is not None and not 0 <= self.warmup_s < math.inf:
            raise ValueError(f"warmup_s must be a finite number >= 0, got {self.warmup_s}")
        if not (self.num_requests - 1) / self.qps <= MAX_ARRIVAL_S:  # 1e-308 gave an infinite arrival at row 1
            raise ValueError(f"qps {self.qps:g} spreads {self.num_requests:,} requests over "
                             f"{(self.num_requests - 1) / self.qps:.3g} s; expected at most {MAX_ARRIVAL_S:g} s "
                             "(raise qps)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:  # numpy's seeds are >= 0
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")


def _single_turn(config: SynthConfig, prompt: LengthDist, output: LengthDist) -> pl.DataFrame:
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(config.seed).spawn(3)]
    n = config.num_requests
    return pl.DataFrame(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": arrival_times_s(n, config.qps, config.arrival_cv, streams[0], "arrival_cv"),
            "prompt_tokens": prompt.sample(n, streams[1]),
            "output_tokens": output.sample(n, streams[2]),
        }
    )


def _length_dist(text: str, role: str, field: str) -> LengthDist:
    """``parse_length_dist``, its error naming the field (so the option: --turns 0 said only "distribution '0':
    unknown kind", not which of the three distributions it was)."""
    try:
        return parse_length_dist(text, role)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None


def synthesize(config: SynthConfig) -> Trace:
    """Build the trace described by `config` (validated, ready to save or replay)."""
    return synthesize_counting_cuts(config)[0]


def synthesize_counting_cuts(config: SynthConfig) -> tuple[Trace, int]:
    """The trace and how many of its first turns of sessions (prompt, output or both) were cut to fit
    max_context_tokens."""
    prompt = _length_dist(config.prompt_dist, "prompt", "prompt_dist")
    output = _length_dist(config.output_dist, "output", "output_dist")
    source = f"synthetic trace (seed {config.seed})"
    if not config.multi_turn:
        return Trace.from_frame(_single_turn(config, prompt, output), source), 0
    sessions = SessionConfig(
        turns=_length_dist(config.turns_dist, "turns", "turns_dist"),
        user_tokens=prompt,
        answer_tokens=output,
        think_time_s=config.think_time_s,
        think_time_cv=config.think_time_cv,
        hash_block_size=config.hash_block_size,
        max_context_tokens=config.max_context_tokens,
    )
    frame = build_sessions(config.num_requests, config.qps, config.arrival_cv, sessions, config.seed, config.warmup_s)
    num_cut = int(frame[CUT_COLUMN].sum()) if CUT_COLUMN in frame.columns else 0
    return Trace.from_frame(frame.drop(CUT_COLUMN, strict=False), source, config.hash_block_size), num_cut


DIST_HELP = (
    "KIND[:key=value,...] with KIND one of: fixed:N; uniform:low=A,high=B; "
    "lognormal:mean=M,sigma=S (or median=M), optional max=N; geometric:mean=M, optional max=N; "
    "sharegpt (published ShareGPT statistics, see traces/README.md)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m traces.synth",
        description="Write a synthetic request trace (parquet). Deterministic for a given --seed.",
    )
    parser.add_argument("-o", "--output", required=True, type=nonempty, help="parquet file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace -o if it exists")
    parser.add_argument("--num-requests", type=int, required=True, help="number of requests in the trace")
    parser.add_argument("--qps", type=float, required=True, help="mean request rate, requests per second")
    parser.add_argument(
        "--arrival", choices=("poisson", "gamma"), default="poisson",
        help="inter-arrival process: poisson (exponential gaps) or gamma (burstiness set by --cv); with --multi-turn, "
             "of the sessions' starts (a session's later turns follow its think times)",
    )
    parser.add_argument(
        "--cv", type=float, default=None,
        help="coefficient of variation of gamma gaps (1 = Poisson, >1 bursty; vLLM's --burstiness is 1/cv**2); with "
             "--multi-turn, of the gaps between sessions' starts, not between requests",
    )
    parser.add_argument(
        "--prompt-dist", default="sharegpt", help=f"prompt length (per user message with --multi-turn): {DIST_HELP}"
    )
    parser.add_argument("--output-dist", default="sharegpt", help=f"output length: {DIST_HELP}")
    parser.add_argument(
        "--multi-turn", action="store_true",
        help="draw chat sessions; later turns reuse earlier turns as prefix (hash_ids)",
    )
    # The --multi-turn options default to None, so that one given without --multi-turn is told from one left out
    # (config_from_args fills in _SESSION_OPTIONS' defaults): --hash-block-size 16 alone was ignored without a word.
    parser.add_argument("--turns", default=None,
                        help=f"turns per session with --multi-turn (default: sharegpt): {DIST_HELP}")
    parser.add_argument(
        "--think-time-s", type=float, default=None,
        help="mean gap between a turn's arrival and the next turn's (s; default: 30)"
    )
    parser.add_argument(
        "--think-time-cv", type=float, default=None,
        help="coefficient of variation of think times (1 = exponential, the default; 0 = fixed)",
    )
    parser.add_argument("--hash-block-size", type=int, default=None,
                        help="tokens per hash block with --multi-turn (default: 16)")
    parser.add_argument(
        "--max-context-tokens", type=int, default=None,
        help="with --multi-turn: a session ends before a turn whose prompt + output would exceed this, and a first "
        "turn that would is cut to fit (prompt to at most half of it, output to the rest; the summary line counts "
        "them; default: 16384)",
    )
    parser.add_argument(
        "--warmup-s", type=float, default=None,
        help="with --multi-turn, start sessions this long before the trace window so it opens in steady "
        "state (default: 4 x mean turns x mean think time; 0 = ramp up from an idle start)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    return parser


# The options of --multi-turn sessions: (option, argparse name, default).
_SESSION_OPTIONS = (("--turns", "turns", "sharegpt"), ("--think-time-s", "think_time_s", SynthConfig.think_time_s),
                    ("--think-time-cv", "think_time_cv", SynthConfig.think_time_cv),
                    ("--hash-block-size", "hash_block_size", SynthConfig.hash_block_size),
                    ("--max-context-tokens", "max_context_tokens", SynthConfig.max_context_tokens),
                    ("--warmup-s", "warmup_s", SynthConfig.warmup_s))


def config_from_args(args: argparse.Namespace) -> SynthConfig:
    if args.arrival == "poisson" and args.cv not in (None, 1.0):
        raise ValueError("--cv applies to --arrival gamma; a Poisson process has CV 1")
    if args.arrival == "gamma" and args.cv is None:
        raise ValueError("--arrival gamma needs --cv")
    if not args.multi_turn:  # each was ignored without a word: --hash-block-size 7 wrote a trace without hash_ids
        session_only = [option for option, value, _ in _SESSION_OPTIONS if getattr(args, value) is not None]
        if session_only:
            raise ValueError(f"{', '.join(session_only)} {'applies' if len(session_only) == 1 else 'apply'} to "
                             "--multi-turn sessions; pass --multi-turn or leave "
                             f"{'it' if len(session_only) == 1 else 'them'} out")
    for _, value, default in _SESSION_OPTIONS:  # left out: the default (None for --warmup-s: derived from the rest)
        if getattr(args, value) is None:
            setattr(args, value, default)
    return SynthConfig(
        num_requests=args.num_requests,
        qps=args.qps,
        arrival_cv=1.0 if args.cv is None else args.cv,
        prompt_dist=args.prompt_dist,
        output_dist=args.output_dist,
        multi_turn=args.multi_turn,
        turns_dist=args.turns,
        think_time_s=args.think_time_s,
        think_time_cv=args.think_time_cv,
        hash_block_size=args.hash_block_size,
        max_context_tokens=args.max_context_tokens,
        warmup_s=args.warmup_s,
        seed=args.seed,
    )


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        refuse_to_replace(args.output, args.overwrite)  # before drawing: a refused command costs nothing
    except OSError as exc:
        parser.exit(2, f"error: -o {args.output}: {exc.strerror}\n")
    try:
        trace, num_cut = synthesize_counting_cuts(config_from_args(args))
    except ValueError as exc:
        parser.error(_with_option_names(str(exc)))
    except MemoryError:
        parser.exit(2, f"error: --num-requests {args.num_requests}: not enough memory to draw that many requests\n")
    try:
        save_trace(trace, args.output)
    except OSError as exc:
        parser.exit(2, f"error: -o {args.output}: {exc.strerror or exc}\n")
    # First turns, not prompts: a turn whose output alone overflows is cut there (its prompt kept), and the line said
    # "prompts cut" of prompts left whole.
    cut = (f"{counted(num_cut, 'first turn')} cut to fit --max-context-tokens {args.max_context_tokens}"
           if num_cut else "")
    with outputs_in_place(f"{escape_controls(args.output)} is complete"):  # a Ctrl-C now says it is whole
        print(describe(trace, args.output, cut))
    return 0


# SynthConfig's fields as the command line spells them: an error names the option to change.
_OPTIONS = {"num_requests": "--num-requests", "qps": "--qps", "arrival_cv": "--cv", "think_time_s": "--think-time-s",
            "think_time_cv": "--think-time-cv", "hash_block_size": "--hash-block-size",
            "max_context_tokens": "--max-context-tokens", "warmup_s": "--warmup-s", "seed": "--seed",
            "prompt_dist": "--prompt-dist", "output_dist": "--output-dist", "turns_dist": "--turns"}


def _with_option_names(message: str) -> str:
    return re.sub(r"\b(" + "|".join(_OPTIONS) + r")\b", lambda m: _OPTIONS[m.group(1)], message)


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
