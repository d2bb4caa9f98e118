"""Replay a trace against an OpenAI-compatible server over HTTP: ``python -m traces.bench URL TRACE``.

The requests are the in-process replays' (same selection and rescaling of arrivals, same prompt token ids
for the same vocabulary size and seed), sent on the trace's schedule by ``traces.http_bench`` and timed
by the client. Writes requests.parquet, an empty steps.parquet (a server shows no step log), summary.json
and report.html through the replays' writer, so ``analysis.compare SERVED_DIR SIM_DIR`` works. Columns a
client cannot know (first scheduling, cached tokens unless the server's usage reports them, preemptions)
are null. Exit codes: 0 done, 1 every request failed, 2 bad input, 130 interrupted (nothing written).
"""

from __future__ import annotations

import argparse
import math
import sys
from array import array
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from analysis.metrics import CLIENT_TIMING
from analysis.outdir import OutDirError, default_out_dir, folder_complete, input_files, staged_out_dir
from analysis.progress import progress_bar
from cli.replay_args import (
    add_output_arguments,
    add_trace_arguments,
    check_real_time_span,
    load_trace_for_replay,
    metric_percentiles_from_args,
    slos_from_args,
)
from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import InterruptedOnceWritten, exit_130_on_interrupt, outputs_in_place, run_async
from engine.core.messages import escape_controls, one_line
from engine.core.sampling_params import MAX_TEMPERATURE
from sim.limits import format_warnings
from traces.files import existing_path

if TYPE_CHECKING:
    from traces.http_bench import BenchResult

NUM_ERRORS_SHOWN = 5
EXIT_ALL_FAILED, EXIT_INTERRUPTED = 1, 130


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m traces.bench",
        description="Replay a request trace against an OpenAI-compatible server (ours, vLLM, SGLang) over HTTP, "
                    "streaming, with the trace's arrival times; time every request from the client's side.",
        epilog="exit codes: 0 done; 1 every request failed; 2 bad input; 130 interrupted (nothing written)",
    )
    parser.add_argument("url", metavar="URL", help="the server's base URL, e.g. http://127.0.0.1:8000")
    add_trace_arguments(parser)
    g = parser.add_argument_group("requests")
    g.add_argument("--model", default=None,
                   help="model name sent in each request (default: the first model the server lists)")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary the prompt token ids are drawn from (default: --model's config, a shipped "
                        "name or an HF directory, as sim.replay sizes them)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the synthesized prompt tokens (as the replays' --seed; default 0)")
    g.add_argument("--prompt-format", choices=("tokens", "text"), default="tokens",
                   help="token-id prompts (exact, what vLLM and our server accept) or text of the same token "
                        "length for servers that refuse ids (needs --tokenizer)")
    g.add_argument("--tokenizer", default=None, help="HF tokenizer path or name for --prompt-format text")
    g.add_argument("--endpoint", default="/v1/completions", help="completions path (default /v1/completions)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--max-concurrency", type=int, default=None,
                   help="at most this many requests in flight (later ones wait, and are sent late)")
    g.add_argument("--request-timeout-s", type=float, default=600.0,
                   help="a request without a complete answer this long after its send fails (default 600)")
    add_output_arguments(parser, "output folder (default: a new folder under runs/)")
    return parser


def _check_args(args: argparse.Namespace) -> None:
    try:
        url = urlparse(args.url)
    except ValueError:  # an unclosed '[' (IPv6): urlparse's message named no URL
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError(f"URL {args.url!r}: expected http://HOST:PORT or https://HOST:PORT")
    try:
        url.port  # noqa: B018  urlparse checks the port only when asked: 99999 reached aiohttp as an invalid URL
    except ValueError:
        raise ValueError(f"URL {args.url!r}: the port must be a number from 0 to 65535") from None
    if url.query or url.fragment or url.path.rstrip("/").endswith(_ENDPOINT_SUFFIXES):
        # It is a base to which /v1/models and --endpoint are appended: "http://h:8000?x=1" became
        # "http://h:8000?x=1/v1/models", and ".../v1/completions" ".../v1/completions/v1/models", both a bare 404.
        raise ValueError(f"URL {args.url!r}: expected the server's base URL, such as http://HOST:PORT or "
                         "http://HOST:PORT/v1 (a path prefix of a proxy is fine), without a query, a fragment or an "
                         "endpoint; the endpoint is --endpoint (default /v1/completions)")
    if args.model is not None and not args.model.strip():  # read as no --model: the server's first was benched
        raise ValueError("--model is empty; expected the served model's name (or leave it out for the server's "
                         "first)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    if not (math.isfinite(args.request_timeout_s) and args.request_timeout_s > 0):
        raise ValueError(f"--request-timeout-s must be a finite number > 0, got {args.request_timeout_s}")
    if not 0 <= args.temperature <= MAX_TEMPERATURE:  # 1e308 is refused by a server (ours) for every request
        raise ValueError(f"--temperature must be a number from 0 to {MAX_TEMPERATURE:g}, got {args.temperature}")
    if args.vocab_size is not None and not 1 <= args.vocab_size < 2**32:
        raise ValueError(f"--vocab-size must be from 1 to 2**32 - 1, got {args.vocab_size}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be from 0 to 2**63 - 1, got {args.seed}")
    if args.prompt_format == "text" and not args.tokenizer:
        raise ValueError("--prompt-format text needs --tokenizer PATH (the served model's tokenizer)")
    if not args.endpoint.startswith("/"):  # it is appended to the URL: "v1/completions" made every request fail
        raise ValueError(f"--endpoint {args.endpoint!r}: expected a path that starts with '/', such as "
                         "/v1/completions")
    if args.endpoint.rstrip("/").endswith("/chat/completions"):
        # The client sends completions bodies (a prompt, not messages): every request was a 400 and the run exit 1.
        raise ValueError(f"--endpoint {args.endpoint!r}: a chat endpoint takes messages, and this client sends "
                         "completions requests (a prompt of token ids or text); expected a completions path such as "
                         "/v1/completions")
    if args.tokenizer and args.prompt_format != "text":
        raise ValueError("--tokenizer is for --prompt-format text; token-id prompts need no tokenizer")


_ENDPOINT_SUFFIXES = ("/completions", "/models", "/health", "/metrics")


def early_stops_warnings(results: list[BenchResult], requests) -> list[dict]:
    """Summary warnings when finished requests stopped before the output length the trace asks for: the replay
    sends ignore_eos, and a server that does not honour it (or a stop token) ends them early, so the workload was
    not the trace's and a comparison with a simulated replay compares other requests (it checks prompt lengths
    only). A server's limit (finish reason 'length' short of max_tokens) cuts them too: those are recorded as cut."""
    pairs = [(r, q.max_tokens) for r, q in zip(results, requests) if r.ok]
    short = [(r, asked) for r, asked in pairs
             if r.finish_reason == "stop" and r.output_tokens is not None and r.output_tokens < asked]
    cut = [(r, asked) for r, asked in pairs if r.cut_by is not None]
    warnings = []
    if short:
        warnings.append(_short_outputs_warning("outputs_shorter_than_trace", short, len(results), "stopped",
                                               "finish reason 'stop'", "the server did not honour ignore_eos"))
    if cut:
        warnings.append(_short_outputs_warning(
            "outputs_cut_by_the_server", cut, len(results), "were cut",
            f"finish reason 'length', recorded as cut by {cut[0][0].cut_by}",
            "a limit of the server's (its context length) ended them"))
    return warnings


def bundled_tokens_warnings(results: list[BenchResult]) -> list[dict]:
    """A summary warning when served streams carried several tokens in a chunk (the usage counts more tokens than
    chunks with text): the client sees one time per chunk, so the run's ITL is the gap between chunks (as vLLM's
    bench measures it) where a simulated replay's is the gap between tokens; TPOT, from the token counts, is per
    token in both. Unsaid, a server streaming 4 tokens a chunk compared with the simulator at 4x its ITL."""
    bundled = [r for r in results if r.ok and r.reject_reason is None
               and r.output_tokens > len(r.chunk_times_s) - r.closes_finish_only]
    if not bundled:
        return []
    example = bundled[0]
    num_chunks = len(example.chunk_times_s) - example.closes_finish_only
    return [{"code": "tokens_bundled_in_chunks", "value": len(bundled),
             "message": f"{len(bundled)} of {len(results)} requests were streamed with several tokens in a chunk "
                        f"(e.g. request {example.request_id!r}: {example.output_tokens} tokens in {num_chunks} "
                        "chunks): their token times are the chunks', so ITL is the gap between chunks, not between "
                        "tokens as a simulated replay's; compare TPOT instead"}]


def _short_outputs_warning(code: str, found: list, num_results: int, verb: str, how: str, why: str) -> dict:
    """A warning about ``found`` (result, tokens asked) pairs whose outputs ended short of the trace's lengths."""
    example, asked = found[0]
    return {"code": code, "value": len(found),
            "message": f"{len(found)} of {num_results} requests {verb} before the output length the trace asks for "
                       f"(e.g. request {example.request_id!r}: {example.output_tokens} of {asked} tokens, {how}): "
                       f"{why}, so the workload was not the trace's"}


def base_url(url: str) -> str:
    """``http://host:port`` from what users paste: a trailing slash or ``/v1`` is dropped."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _load_tokenizer(path: str):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("--prompt-format text needs transformers (pip install transformers)") from None
    found = existing_path(path)  # None for a hub name too long to be a file's (is_file() raised "File name too long")
    # transformers' message spoke of a config "mapping, not list" (a TypeError traceback)
    if found is not None and found.is_file():
        raise ValueError(f"--tokenizer {path}: is a file; expected a Hugging Face tokenizer directory or name")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many types for a missing or broken tokenizer
        reason = one_line(exc, 300)  # its messages span lines (the first alone ended in "one of: ")
        raise ValueError(f"--tokenizer {path}: cannot load it ({reason})") from None


def _vocab_size(args: argparse.Namespace, model: str, tokenizer) -> int:
    if args.vocab_size is not None:
        return args.vocab_size
    if tokenizer is not None:
        return int(tokenizer.vocab_size)
    from engine.core.model_config import ModelShape

    try:
        return ModelShape.load(model).vocab_size
    except (FileNotFoundError, ValueError) as exc:
        raise ValueError(f"cannot tell the vocabulary of model {model!r} for its prompt token ids ({exc}); "
                         "pass --vocab-size (the value sim.replay's --model uses)") from None


def result_rows(results: list[BenchResult], requests, origin_s: float) -> list[tuple]:
    """REQUEST_COLUMNS rows (engine.core.records) of the results; times shifted by ``origin_s`` so arrivals
    line up with the trace's (and a simulated replay's)."""
    rows = []
    for result, request in zip(results, requests):
        times = array("d", (origin_s + t for t in result.chunk_times_s))
        sent = None if result.send_s is None else origin_s + result.send_s
        finish = times[-1] if times else sent
        if result.output_tokens is not None and len(times) > result.output_tokens:
            # A server may end a stream with a chunk that carries only the finish reason: no token. The request
            # still ends at it; the token times are the count the server's usage reports (as the run schema needs).
            del times[result.output_tokens:]
        rows.append((
            str(result.request_id), 0,  # as request_row writes it: trace ids may be integers
            sent if sent is not None else origin_s + result.scheduled_s,
            None,  # first scheduled: the server's business, unseen by a client
            times[0] if times else None,
            finish,
            result.prompt_tokens if result.prompt_tokens is not None else request.prompt_tokens,
            result.output_tokens if result.output_tokens is not None else len(times),
            result.cached_tokens,  # only when the server's usage reports it
            None,  # preemptions: unseen by a client
            result.recorded_reason,
            result.reject_reason,
            times,
        ))
    return rows


def requests_table(results: list[BenchResult], requests, origin_s: float):
    import pyarrow as pa

    from engine.core.records import requests_to_arrow

    table = requests_to_arrow(result_rows(results, requests, origin_s))
    table = table.append_column("scheduled_arrival_s",
                                pa.array([origin_s + r.scheduled_s for r in results], pa.float64()))
    return table.append_column("error", pa.array([r.error for r in results], pa.string()))


def format_failures(results: list[BenchResult]) -> str:
    """``N of M requests failed`` and the first few distinct errors; "" when none failed."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return ""
    lines = [f"{len(failed)} of {len(results)} requests failed; first errors:"]
    seen: set[str] = set()
    for result in failed:
        if result.error not in seen:
            seen.add(result.error)
            lines.append(f"  request {result.request_id!r}: {escape_controls(result.error)}")  # a server's words
        if len(seen) == NUM_ERRORS_SHOWN:
            break
    return "\n".join(lines)


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        import aiohttp  # noqa: F401  the client's one dependency beyond the simulator's: say so, not a traceback
    except ImportError:
        parser.exit(2, "error: traces.bench needs aiohttp; install it (pip install -e '.[bench]')\n")
    from traces.bench_prompts import check_prompt_lengths
    try:
        _check_args(args)
        trace = load_trace_for_replay(args)
        check_real_time_span(trace, args.trace)  # --time-scale 1e9 waited years, where engine.replay refused it
        check_prompt_lengths(trace)  # before any request: the ids of a 1e10-token prompt filled the memory
        slos = slos_from_args(args)
        args.metric_percentiles = metric_percentiles_from_args(args)
        tokenizer = _load_tokenizer(args.tokenizer) if args.prompt_format == "text" else None
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    url = base_url(args.url)
    out_dir = Path(args.out) if args.out else default_out_dir("bench", Path(args.trace).stem)
    try:
        # Made now, so a bad --out fails at once; never over an input.
        with staged_out_dir(out_dir, overwrite=args.overwrite, inputs=input_files(args)) as stage:
            summary, results = _bench_into(stage, url, trace, tokenizer, slos, args)
    except InterruptedOnceWritten:  # as the outputs moved into place: they are whole, and the line says so
        raise
    except KeyboardInterrupt:
        print(f"\ninterrupted: nothing written to {escape_controls(out_dir)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OutDirError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    except OSError as exc:  # a full disk while writing: nothing was moved into place
        parser.exit(2, f"error: --out {out_dir}: {exc.strerror or exc}\n")
    with outputs_in_place(folder_complete(out_dir)):  # a Ctrl-C now says they are whole
        _print_lines_about(summary, results, url, out_dir, args.quiet)
    return EXIT_ALL_FAILED if results and all(not r.ok for r in results) else 0


def _print_lines_about(summary: dict, results: list, url: str, out_dir: Path, quiet: bool) -> None:
    failures = format_failures(results)
    if failures:
        print(failures, file=sys.stderr)
    if summary.get("warnings"):
        print(format_warnings(summary["warnings"]), file=sys.stderr)
    if not quiet:
        from analysis.report.summary_table import format_summary_table

        print(format_summary_table(summary))
        model = escape_controls(summary["config"]["model"])  # as the server named it in /v1/models
        print(f"served by {escape_controls(url)} (model {model}); outputs in {escape_controls(out_dir)}/")


def _bench_into(out_dir: Path, url: str, trace, tokenizer, slos, args: argparse.Namespace):
    from analysis.runs import write_run
    from engine.core.records import StepLog
    from traces.bench_prompts import bench_requests
    from traces.http_bench import BenchTarget, first_model, replay_over_http

    model = args.model or run_async(first_model(url))
    vocab_size = _vocab_size(args, model, tokenizer)
    requests = bench_requests(trace, vocab_size, args.seed, tokenizer)
    target = BenchTarget(completions_url=url + args.endpoint, model=model, max_concurrency=args.max_concurrency,
                         timeout_s=args.request_timeout_s, temperature=args.temperature)
    with progress_bar(args.quiet, total=len(requests), unit="req", desc="requests", mininterval=0.5) as progress:
        results = run_async(replay_over_http(target, requests,
                                               on_done=(lambda _: progress.update()) if progress else None))
    origin_s = float(trace.requests["arrival_s"][0])
    config = {
        "url": url, "endpoint": args.endpoint, "model": model, "prompt_format": args.prompt_format,
        "tokenizer": args.tokenizer, "vocab_size": vocab_size, "seed": args.seed,
        "temperature": args.temperature, "max_concurrency": args.max_concurrency,
        "request_timeout_s": args.request_timeout_s, "qps": args.qps, "time_scale": args.time_scale,
        "limit": args.limit, "offline": args.offline,
    }
    warnings = early_stops_warnings(results, requests) + bundled_tokens_warnings(results)
    summary = write_run(
        out_dir, requests_table(results, requests, origin_s), StepLog().to_arrow(),
        {"cost_model": f"served over HTTP ({CLIENT_TIMING})", "trace": str(args.trace), "config": config,
         "warnings": warnings},
        report_title=None if args.no_report else f"Served replay of {Path(args.trace).name}",
        report_subtitle=f"{model} at {url}, timed by the client", slos=slos,
        metric_percentiles=args.metric_percentiles,
    )
    return summary, results
