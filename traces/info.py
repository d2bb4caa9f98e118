"""Validate a trace file and print its summary: `python -m traces.info PATH [PATH ...]`."""

from __future__ import annotations

import sys

from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done
from engine.core.messages import counted, escape_controls
from traces.errors import TraceError
from traces.schema import load_trace
from traces.summary import shown_span


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog="python -m traces.info",
        description="Load (and so validate) trace parquet files and print one summary line each.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace parquet file(s)")
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        try:
            trace = load_trace(path)
        except TraceError as exc:
            print(f"error: {escape_controls(exc)}", file=sys.stderr)  # a path's newline too: one line
            status = 2
            continue
        requests = trace.requests
        span_s = float(requests["arrival_s"][-1] - requests["arrival_s"][0])
        extras = [c for c in requests.columns if c not in ("request_id", "arrival_s", "prompt_tokens", "output_tokens")]
        print(
            f"{escape_controls(path)}: {counted(len(trace), 'request')} over {shown_span(span_s)} s, "
            f"mean prompt {requests['prompt_tokens'].mean():.1f}, "
            f"mean output {requests['output_tokens'].mean():.1f} tokens, other columns {extras}"
            + (f", hash_block_size {trace.hash_block_size}" if trace.hash_block_size else "")
        )
    return status


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
