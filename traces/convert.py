"""Convert public traces to the project's parquet schema: `python -m traces.convert FORMAT SRC -o OUT`.

Every format goes through the same steps: read (format specific, errors name the file,
line and field), stable sort by arrival, optional rescale to --qps, optional --limit,
validate, write, and print a one-line summary.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from engine.core.config_args import OneLineErrorParser, nonempty
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.messages import escape_controls
from traces.errors import TraceError
from traces.files import refuse_to_replace
from traces.formats import FORMATS, ConvertOptions
from traces.formats.guess import with_format_hint
from traces.formats.mooncake import MOONCAKE_BLOCK_TOKENS
from traces.schema import Trace, save_trace
from traces.summary import describe
from traces.validation import MAX_ARRIVAL_S, MAX_HASH_BLOCK_SIZE

_DEFAULT_OPTIONS = ConvertOptions()  # frozen: one shared default instance, as the old default argument was


def convert(fmt: str, source: str | Path, options: ConvertOptions = _DEFAULT_OPTIONS) -> tuple[Trace, str]:
    """Read `source` in format `fmt`; returns the validated trace and a note on the source (a Mooncake file without
    hash_ids) and on the dropped rows (with a limit, those before the last kept request: the rows past it were never
    candidates)."""
    if fmt not in FORMATS:
        raise TraceError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    source = Path(source)
    try:
        converted = FORMATS[fmt].read(source, options)
    except TraceError as exc:  # a trace of another format fails on its layout: say which format it looks like
        raise TraceError(with_format_hint(str(exc), fmt, source)) from None
    requests = converted.requests
    if requests.height == 0:
        raise TraceError(f"{source}: no requests left after dropping empty ones ({converted.drop_reason()})")
    requests = requests.sort("arrival_s", maintain_order=True)
    if options.limit is not None:
        requests = requests.head(min(options.limit, requests.height))  # polars refuses n beyond 2**64
    if converted.arrivals_assigned:
        _check_drawn_arrivals(fmt, source, requests["arrival_s"].max(), options)
    elif options.seed is not None:  # a vidur file with arrived_at: its arrivals are rescaled, and --seed went unread
        raise TraceError(f"{source}: --seed {options.seed}: the file records its arrival times ({fmt}'s arrived_at), "
                         "so none are drawn and it would change nothing; convert without --seed")
    trace = Trace.from_frame(requests, f"{source} (converted from {fmt})", converted.hash_block_size)
    if options.qps is not None and not converted.arrivals_assigned:
        arrivals = trace.requests["arrival_s"]
        if arrivals[-1] == arrivals[0]:  # Trace.with_qps' advice names replay options (--offline) convert lacks
            raise TraceError(f"{source}: --qps {options.qps:g}: all {len(trace)} request(s) arrive at "
                             f"{arrivals[0]:g} s, so there is no rate to rescale; convert without --qps")
        trace = trace.with_qps(options.qps)
    # with --limit, the drops among the rows it went through
    return trace, ", ".join(part for part in (converted.note, converted.drop_reason(options.limit)) if part)


def _check_drawn_arrivals(fmt: str, source: Path, last_s: float, options: ConvertOptions) -> None:
    """The arrivals drawn at --qps (and --think-time-s) end within the trace's bound: past it the error named a row of
    the converted trace and asked whether its arrival was 'a timestamp, not an offset?', not the options that drew
    it."""
    if last_s <= MAX_ARRIVAL_S:
        return
    think = f" with --think-time-s {options.think_time_s:g}" if fmt == "sharegpt" else ""
    raise TraceError(f"{source}: the arrivals drawn at --qps {options.qps:g}{think} reach {last_s:.3g} s; expected at "
                     f"most {MAX_ARRIVAL_S:g} s (raise --qps{' or lower --think-time-s' if think else ''})")


def build_parser() -> argparse.ArgumentParser:
    formats = "\n".join(f"  {name:<9} {spec.summary}" for name, spec in FORMATS.items())
    parser = OneLineErrorParser(
        prog="python -m traces.convert",
        description="Convert a public request trace to the trace parquet schema (see traces/README.md).",
        epilog=f"formats:\n{formats}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("format", choices=sorted(FORMATS), metavar="FORMAT", help="source format (listed below)")
    parser.add_argument("source", metavar="SRC", help="source trace file")
    parser.add_argument("-o", "--output", required=True, type=nonempty, help="parquet file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace -o if it exists")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N requests by arrival")
    parser.add_argument(
        "--tokenizer", default=None, help="sharegpt: local Hugging Face tokenizer directory (no downloads)"
    )
    parser.add_argument(
        "--qps", type=float, default=None,
        help="mean request rate: sharegpt and vidur without arrived_at draw seeded Poisson arrivals at this "
        "rate; formats with recorded times are rescaled to it (gaps keep their shape)",
    )
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for arrivals and think times drawn at --qps (sharegpt; vidur without arrived_at; "
                             "default 0)")
    defaults = ConvertOptions()
    parser.add_argument(
        "--think-time-s", type=float, default=None,
        help=f"sharegpt: mean gap between turns of a conversation (s; default {defaults.think_time_s:g})",
    )
    parser.add_argument(
        "--think-time-cv", type=float, default=None,
        help="sharegpt: think-time coefficient of variation (1 = exponential, 0 = fixed; "
        f"default {defaults.think_time_cv:g})",
    )
    parser.add_argument(
        "--hash-block-size", type=int, default=None,
        help=f"mooncake: tokens per hash_ids block (default {MOONCAKE_BLOCK_TOKENS}, the published traces'; other "
        "values for traces synthesized in that layout)",
    )
    return parser


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if args.qps is not None and not (0 < args.qps < math.inf and 1.0 / args.qps < math.inf):
        parser.error(f"--qps must be a finite number > 0, got {args.qps}")
    # Options only sharegpt reads: given with another format they would change nothing, and say nothing about it.
    sharegpt_only = [flag for flag, value in (("--tokenizer", args.tokenizer), ("--think-time-s", args.think_time_s),
                                              ("--think-time-cv", args.think_time_cv)) if value is not None]
    defaults = ConvertOptions()
    args.think_time_s = defaults.think_time_s if args.think_time_s is None else args.think_time_s
    args.think_time_cv = defaults.think_time_cv if args.think_time_cv is None else args.think_time_cv
    if not 0 < args.think_time_s < math.inf:
        parser.error(f"--think-time-s must be a finite number > 0, got {args.think_time_s}")
    if not 0 <= args.think_time_cv < math.inf:
        parser.error(f"--think-time-cv must be a finite number >= 0, got {args.think_time_cv}")
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed must be an integer >= 0, got {args.seed}")
    # Only drawn arrivals read it: with any other format (or vidur without --qps) it would change nothing either.
    if args.seed is not None and args.format != "sharegpt" and (args.format != "vidur" or args.qps is None):
        what = "vidur without --qps keeps its recorded arrivals" if args.format == "vidur" else \
            f"{args.format} traces record their arrival times"
        parser.error(f"--seed only applies to arrivals drawn at --qps (sharegpt, and vidur without arrived_at); "
                     f"{what}, so it would change nothing")
    if args.hash_block_size is not None and not 1 <= args.hash_block_size <= MAX_HASH_BLOCK_SIZE:
        parser.error(f"--hash-block-size must be an integer from 1 to {MAX_HASH_BLOCK_SIZE}, got "
                     f"{args.hash_block_size}")
    if args.hash_block_size is not None and args.format != "mooncake":
        parser.error(f"--hash-block-size only applies to the mooncake format (its hash_ids name blocks of prompt "
                     f"tokens); {args.format} traces have no hash_ids")
    if args.format != "sharegpt" and sharegpt_only:
        verb = "applies" if len(sharegpt_only) == 1 else "apply"
        parser.error(f"{', '.join(sharegpt_only)} only {verb} to the sharegpt format (its text is tokenized and its "
                     f"turns spaced); {args.format} traces give token counts, not text or conversations")
    options = ConvertOptions(
        limit=args.limit, tokenizer=args.tokenizer, qps=args.qps, seed=args.seed,
        think_time_s=args.think_time_s, think_time_cv=args.think_time_cv, hash_block_size=args.hash_block_size,
    )
    source, output = Path(args.source), Path(args.output)
    if output.exists() and source.exists() and output.resolve() == source.resolve():
        parser.exit(2, f"error: -o {args.output} is the source trace; write the parquet elsewhere\n")
    if args.tokenizer and Path(args.tokenizer).resolve() in output.resolve().parents:  # --overwrite took its files
        parser.exit(2, f"error: -o {args.output} is inside --tokenizer {args.tokenizer}; write the parquet elsewhere\n")
    try:
        refuse_to_replace(args.output, args.overwrite)  # as typed: Path drops a trailing '/'
        trace, dropped = convert(args.format, args.source, options)
        save_trace(trace, args.output)
    except (TraceError, ValueError) as exc:
        print(f"error: {escape_controls(exc)}", file=sys.stderr)  # a path's newline too: one line
        return 2
    except OSError as exc:
        print(f"error: -o {escape_controls(args.output)}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    with outputs_in_place(f"{escape_controls(args.output)} is complete"):  # a Ctrl-C now says it is whole
        print(describe(trace, args.output, dropped))
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
