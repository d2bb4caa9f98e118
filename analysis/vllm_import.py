"""Runs measured by ``vllm bench serve --save-result --save-detailed``, as replay runs.

``python -m analysis.vllm_import RESULT.json --out DIR [--trace TRACE]`` writes a run folder (the replays'
layout); ``analysis.compare`` also reads the JSON file directly in place of a folder.

What the file records, per request (the lists of its detailed result): ``input_lens``, ``output_lens``,
``ttfts``, ``itls`` (the gaps between streamed chunks), ``errors`` (empty for a success), and in newer
versions ``latencies`` (send to last chunk) and ``start_times`` (send times); for the run its ``duration``.
Older files have no ``latencies`` (then E2E is TTFT plus the gaps, which is what vLLM measured) nor
``start_times`` (then every request is placed at t = 0 and the arrival times are unknown: time charts are
meaningless, latencies are not). Throughputs divide by the recorded ``duration``, as vLLM's do.
A request whose streamed chunks outnumber its output tokens, or whose last chunk comes after its latency, is
refused (one line naming the item). A chat endpoint's first chunk is the role's and carries no token: where it
makes one chunk more than the output tokens, it gives the TTFT but no token time. vLLM pools the gap from it to the
first token into its ITL, we do not, so such a run's ITL figures (``mean_itl_ms``, ...) are not the file's own; the
config's ``chat_role_chunks`` counts the requests concerned (TTFT, TPOT and E2E are vLLM's).

SGLang's ``python -m sglang.bench_serving --output-details`` writes the same lists (no ``latencies`` nor
``start_times``) as one JSON line per run, appended: a file of one run reads the same (``analysis.compare`` takes
its ``.jsonl`` name too); one of several is refused. An infinite ``request_rate`` or ``burstiness`` (SGLang's
default rate, vLLM's ``--burstiness inf``, written as ``Infinity``) is recorded as ``"inf"``, as vLLM writes its rate.

What no version records is missing, never 0: queue time (first scheduled), cached tokens, preemptions,
the step log, finish reasons beyond success (a success is marked "length": vLLM cannot tell a stop from
the end of ``max_tokens``). Request ids are the positions in the file unless a trace names them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.console import print_out
from analysis.metrics import CLIENT_TIMING
from analysis.outdir import out_folder
from analysis.runs import non_finite_key
from analysis.schema import (
    FAILED,
    MAX_TIME_S,
    REQUESTS_SCHEMA,
    STEPS_SCHEMA,
    check_requests,
    conform_requests,
    empty_frame,
)
from engine.core.config_args import OneLineErrorParser, nonempty
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.json_errors import json_problem
from engine.core.messages import escape_controls
from sim.files import read_json_input

PER_REQUEST_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
OPTIONAL_PER_REQUEST_KEYS = ("errors", "latencies", "start_times")
SUCCESS_REASON = "length"
POSITIONAL_IDS = "position"  # summary.json's request_ids when ids are the file's positions
COST_MODEL = f"vllm bench serve ({CLIENT_TIMING})"
# How much later than its latency (send to last chunk) a request's last chunk may come out of TTFT plus the gaps:
# vLLM reads the clock once for the first chunk's time and again for its TTFT, and sums of floats round. A
# millisecond is far above both and far below a step.
CLOCK_SLACK_S = 1e-3


@dataclass(frozen=True)
class ImportedRun:
    requests: pl.DataFrame
    steps: pl.DataFrame
    meta: dict  # cost_model, trace, config, recorded_duration_s, request_ids: summary.json's run keys


class VllmResultError(ValueError):
    """A file that is not a usable vLLM bench result; the message names the file, the key and the item."""


def _number(path: Path, key: str, index: int | None, value, *, integer: bool = False) -> float:
    """A count (below 2**53) or a number of seconds (within MAX_TIME_S, what a run's tables hold: a 1e308 s
    TTFT passed here and ended as a traceback in analysis.compare)."""
    where = f"{path}: {key!r}" + ("" if index is None else f" item {index}")
    kind, limit = ("an integer", 2**53) if integer else ("a finite number", MAX_TIME_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (
            integer and not float(value).is_integer()) or value > limit:
        raise VllmResultError(f"{where}: expected {kind} from 0 to {limit:g}, got {value!r:.60}")
    return int(value) if integer else float(value)


def _list(path: Path, data: dict, key: str, n: int | None) -> list | None:
    if key not in data or data[key] is None:
        return None
    values = data[key]
    if not isinstance(values, list):
        raise VllmResultError(f"{path}: {key!r} is a {type(values).__name__}; expected a list with one item per "
                              "request")
    if n is not None and len(values) != n:
        raise VllmResultError(f"{path}: {key!r} has {len(values)} items, 'input_lens' {n}; expected one per request")
    return values


def _is_zero(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _is_chat(data: dict) -> bool:
    """Whether the file timed a chat endpoint (backend or endpoint_type ``openai-chat``): there the first chunk
    streamed is the role's (``{"role": "assistant", "content": ""}``), which vLLM times as the first token."""
    return any(isinstance(data.get(key), str) and "chat" in data[key] for key in ("backend", "endpoint_type"))


def load_json(path: Path) -> dict:
    try:
        data = json.loads(read_json_input(path))  # a regular file only: a FIFO or /dev/zero never ended
    except FileNotFoundError:
        raise VllmResultError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise VllmResultError(f"{path}: is a directory; expected a vllm bench serve result file") from None
    except RecursionError:
        raise VllmResultError(f"{path}: JSON nested too deeply to read; expected a vllm bench serve result") from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and exc.doc[exc.pos:].lstrip().startswith("{"):
            first = json.loads(exc.doc[:exc.pos])  # the value the decoder read before the extra data
            if not (isinstance(first, dict) and any(key in first for key in PER_REQUEST_KEYS)):
                # A Mooncake trace (JSON Lines too) was said to hold "runs appended by --append-result".
                raise VllmResultError(f"{path}: holds several JSON values, the first of which is no vllm bench serve "
                                      f"result (no {', '.join(repr(k) for k in PER_REQUEST_KEYS)}){_trace_hint(path)}; "
                                      "expected a vllm bench serve result") from None
            # vLLM's --append-result and SGLang's bench_serving (always) append one JSON line per run: "Extra data:
            # line 2 column 1" said nothing of that.
            raise VllmResultError(f"{path}: holds more than one result (a JSON value ends on line {exc.lineno - 1} "
                                  "and another follows: runs appended by --append-result or SGLang's bench_serving); "
                                  "expected one run: keep that run's line in a file of its own") from None
        raise VllmResultError(f"{path}: not a readable JSON file ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        detail = getattr(exc, "strerror", None) or exc
        raise VllmResultError(f"{path}: not a readable JSON file ({detail})") from None
    except ValueError as exc:  # an integer of 5000 digits: the message named no file
        raise VllmResultError(f"{path}: not a readable JSON file ({json_problem(exc)})") from None
    if not isinstance(data, dict):
        raise VllmResultError(f"{path}: expected a JSON object (a vllm bench serve result), got "
                              f"{type(data).__name__}")
    return data


def _trace_hint(path: Path) -> str:
    """'; it looks like a FORMAT trace ...' for a public trace given where a result is read, else ''."""
    from traces.formats.guess import guess_format

    guess = guess_format(path)
    if guess is None:
        return ""
    fmt, evidence = guess
    return (f"; it looks like a {fmt} trace ({evidence}), not a run: convert it (python -m traces.convert {fmt} "
            f"{path} -o TRACE.parquet) and replay that")


def read_vllm_result(path: str | Path, request_ids: list[str] | None = None) -> ImportedRun:
    """The file's requests as a requests table; ``request_ids`` (a trace's, in its row order) name them."""
    path = Path(path)
    data = load_json(path)
    missing = [key for key in PER_REQUEST_KEYS if data.get(key) is None]
    if missing:
        if "cost_model" in data or (path.parent / "requests.parquet").is_file():  # a run's own summary.json
            raise VllmResultError(f"{path}: a run's summary.json, not a vllm bench serve result; pass the folder "
                                  f"holding it ({path.parent}), a run folder already, to analysis.compare or "
                                  "analysis.summarize")
        hint = (" (a summary without per-request data: rerun vllm bench serve with --save-detailed)"
                if "mean_ttft_ms" in data or "completed" in data
                else f"{_trace_hint(path)}; expected a vllm bench serve result")
        raise VllmResultError(f"{path}: no {', '.join(repr(k) for k in missing)}{hint}")
    input_lens = _list(path, data, "input_lens", None)
    n = len(input_lens)
    if n == 0:
        raise VllmResultError(f"{path}: 'input_lens' is empty; expected at least one request")
    output_lens, ttfts, itls = (_list(path, data, key, n) for key in ("output_lens", "ttfts", "itls"))
    errors, latencies, starts = (_list(path, data, key, n) for key in OPTIONAL_PER_REQUEST_KEYS)
    if "duration" not in data:
        raise VllmResultError(f"{path}: no 'duration'; expected the benchmark's duration in seconds")
    duration_s = _number(path, "duration", None, data["duration"])
    if request_ids is not None and len(request_ids) < n:
        raise VllmResultError(f"{path}: {n} requests, but the trace names only {len(request_ids)}")
    if starts is not None:
        starts = [_number(path, "start_times", i, v) for i, v in enumerate(starts)]
        origin = min(starts)
    chat = _is_chat(data)
    num_role_chunks = 0  # requests whose role chunk was dropped: their first ITL gap is not pooled, as vLLM pools it
    rows = []
    for i in range(n):
        error = None
        if errors is not None:
            if errors[i] is not None and not isinstance(errors[i], str):
                raise VllmResultError(f"{path}: 'errors' item {i}: expected a string, got {errors[i]!r:.60}")
            error = errors[i] or None
        ttft = _number(path, "ttfts", i, ttfts[i]) if ttfts[i] is not None else None
        if errors is None and not ttft:  # files without errors: a failure has no first token
            error = "failed (the file records no error message)"
        elif error is None and ttft is None:  # counted as failed with a null error, the one failure without a why
            error = "failed (the file records no first token and no error message)"
        gaps = itls[i] if itls[i] is not None else []
        if not isinstance(gaps, list):
            raise VllmResultError(f"{path}: 'itls' item {i}: expected a list of gaps in seconds")
        gaps = [_number(path, "itls", i, gap) for gap in gaps]
        if error is None and ttft == 0 and not gaps and _is_zero(output_lens[i]):
            # vLLM's record of a failure whose error is "" (an HTTP error answered without a reason phrase: vLLM
            # stores `response.reason or ""`): its defaults, ttft 0.0, no gaps, output length 0. Read as a success
            # it refused the whole file (one chunk, 0 output tokens), where vLLM counted it as failed.
            error = "failed (the file records no first token and no error message)"
        arrival = starts[i] - origin if starts is not None else 0.0
        row = {"request_id": request_ids[i] if request_ids is not None else str(i), "replica": 0,
               "arrival_s": arrival, "first_scheduled_s": None, "cached_tokens": None, "num_preemptions": None,
               "reject_reason": None, "prompt_tokens": _number(path, "input_lens", i, input_lens[i], integer=True),
               "error": error}
        if error is None and ttft is not None:
            times = [arrival + ttft]
            for gap in gaps:
                times.append(times[-1] + gap)
            output_tokens = _number(path, "output_lens", i, output_lens[i], integer=True)
            finish_s = times[-1]
            if latencies is not None:
                latency = _number(path, "latencies", i, latencies[i])
                finish_s = max(arrival + latency, times[-1])  # within CLOCK_SLACK_S: the two clock reads, rounding
                if times[-1] - (arrival + latency) > CLOCK_SLACK_S:
                    raise VllmResultError(f"{path}: 'latencies' item {i} is {latency:g} s, but 'ttfts' and 'itls' "
                                          f"item {i} put its last chunk at {times[-1] - arrival:g} s; expected a "
                                          "latency (send to last chunk) no shorter than the TTFT and the gaps")
            first_token_s = times[0]
            if chat and len(times) == output_tokens + 1:
                times = times[1:]  # the role chunk carries no token (its time is vLLM's TTFT, kept)
                num_role_chunks += 1
            if len(times) > output_tokens:
                role = " and the chat role chunk" if chat else ""
                raise VllmResultError(f"{path}: 'itls' item {i} has {len(gaps)} gaps ({len(gaps) + 1} streamed "
                                      f"chunks), 'output_lens' item {i} {output_tokens}; expected at most one chunk "
                                      f"per output token{role}")
            row.update(first_token_s=first_token_s, finish_s=finish_s, token_times_s=times,
                       output_tokens=output_tokens, finish_reason=SUCCESS_REASON)
        else:
            row.update(first_token_s=None, finish_s=arrival, token_times_s=[], output_tokens=0,
                       finish_reason=FAILED)
        rows.append(row)
    schema = {**REQUESTS_SCHEMA, "error": pl.Utf8()}
    requests = pl.DataFrame(rows, schema=schema)
    try:  # what the items above cannot show alone: gaps that sum past the bound, a first token after the last
        check_requests(conform_requests(requests))
    except ValueError as exc:
        raise VllmResultError(f"{path}: the requests it records are impossible ({exc})") from None
    _check_duration(path, duration_s, requests)
    _check_completed(path, data, requests)
    config = {key: data.get(key) for key in ("backend", "model_id", "tokenizer_id", "num_prompts", "request_rate",
                                              "burstiness", "max_concurrency", "date", "label") if key in data}
    for key in ("request_rate", "burstiness"):
        # An infinite rate or burstiness is a setting, not a bad number: SGLang writes its default rate as the JSON
        # token Infinity, vLLM its --burstiness inf (it writes only request_rate as "inf"). Both files were refused.
        if isinstance(config.get(key), float) and config[key] == math.inf:
            config[key] = "inf"
    where = non_finite_key(config, "config")
    if where is not None:  # vLLM writes an infinite request rate as "inf"; a NaN here was written into summary.json
        raise VllmResultError(f"{path}: {where.removeprefix('config.')!r} is NaN or Infinity; expected a finite "
                              "number, a string or null")
    config["arrival_times_recorded"] = starts is not None
    if chat:  # a summary's ITL figures then differ from the file's: say so where they are read
        config["chat_role_chunks"] = num_role_chunks
    meta = {"cost_model": COST_MODEL, "trace": str(path), "config": config, "recorded_duration_s": duration_s,
            "request_ids": "trace" if request_ids is not None else POSITIONAL_IDS}
    return ImportedRun(requests=requests, steps=empty_frame(STEPS_SCHEMA), meta=meta)


def _check_duration(path: Path, duration_s: float, requests: pl.DataFrame) -> None:
    """The recorded duration runs from before the first send to after the last answer: one shorter than the
    requests' own span is no duration of theirs (0 gave throughputs of '-' beside the latencies, without a word;
    a short one, throughputs too high). A millionth is left for rounding."""
    span_s = float(requests["finish_s"].max() - requests["arrival_s"].min())
    if duration_s < span_s * (1 - 1e-6):
        raise VllmResultError(f"{path}: 'duration' is {duration_s:g} s, but its requests span {span_s:g} s from the "
                              "first send to the last answer; expected the benchmark's whole duration")


def _check_completed(path: Path, data: dict, requests: pl.DataFrame) -> None:
    """vLLM's ``completed`` counts the successes of the same lists read here: another count says the lists are not
    that run's (edited, cut, or pasted from another file), and every throughput and latency read from them would be
    another run's figures, without a word (completed 500 beside 2 requests was imported as 2 requests)."""
    if "completed" not in data or data["completed"] is None:
        return
    completed = _number(path, "completed", None, data["completed"], integer=True)
    succeeded = int((requests["finish_reason"] != FAILED).sum())
    if completed != succeeded:
        raise VllmResultError(f"{path}: 'completed' is {completed}, but {succeeded} of the {requests.height} requests "
                              "its lists record succeeded; expected the per-request lists of the same run")


def trace_request_ids(trace_path: str, limit: int | None = None) -> tuple[list[str], list[int]]:
    """The request ids and prompt lengths of a trace's rows (the first ``limit``), in row order."""
    from traces.schema import load_trace

    trace = load_trace(trace_path)
    if limit is not None:
        trace = trace.head(limit)
    frame = trace.requests
    return [str(v) for v in frame["request_id"].to_list()], frame["prompt_tokens"].to_list()


def check_prompt_lengths(run: ImportedRun, path: Path, trace: str, prompt_tokens: list[int]) -> None:
    """Refuse a trace whose rows are not the file's requests (other lengths, in order)."""
    for i, (recorded, expected) in enumerate(zip(run.requests["prompt_tokens"].to_list(), prompt_tokens)):
        if recorded != expected:
            raise VllmResultError(f"{path}: request {i} has {recorded} prompt tokens, row {i} of {trace} "
                                  f"{expected}; expected the trace the benchmark replayed, in its order")


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    from analysis.outdir import OutDirError, folder_complete, staged_out_dir
    from analysis.report.summary_table import format_summary_table
    from analysis.runs import write_run

    parser = OneLineErrorParser(prog="python -m analysis.vllm_import",
                                     description="Turn a `vllm bench serve --save-result --save-detailed` result "
                                                 "file into a replay run folder (for analysis.compare/summarize).")
    parser.add_argument("result", metavar="RESULT.json", help="the result file")
    parser.add_argument("--out", type=out_folder, required=True, help="run folder to write")
    parser.add_argument("--trace", default=None, type=nonempty,
                        help="the trace the benchmark replayed, in the same order: its request ids name the requests "
                             "(default: their positions in the file)")
    parser.add_argument("--limit", type=int, default=None, help="with --trace: the trace's first N rows were replayed")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it holds an earlier run")
    parser.add_argument("--no-report", action="store_true", help="skip report.html")
    parser.add_argument("--quiet", action="store_true", help="no summary table")
    args = parser.parse_args(argv)
    path = Path(args.result)
    try:
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {args.limit}")
        if args.limit is not None and args.trace is None:  # it was ignored without a word
            raise ValueError("--limit applies to --trace (the trace's first N rows were replayed); pass --trace")
        ids = lengths = None
        if args.trace is not None:  # every row: --limit is checked against the file's own count below
            ids, lengths = trace_request_ids(args.trace)
        run = read_vllm_result(path, ids)
        # The file records every request the benchmark sent, so --limit can only repeat its count: a larger one was
        # taken as the replay of rows the file never saw (--limit 500 beside 200 requests imported 200, exit 0).
        if args.limit is not None and args.limit != run.requests.height:
            raise ValueError(f"--limit {args.limit}, but {path} records {run.requests.height} requests; expected "
                             f"--limit {run.requests.height} (the trace's first N rows were replayed) or no --limit")
        if lengths is not None:
            check_prompt_lengths(run, path, args.trace, lengths)
        inputs = [Path(args.result)] + ([Path(args.trace)] if args.trace else [])
        with staged_out_dir(Path(args.out), overwrite=args.overwrite, inputs=inputs) as stage:
            summary = write_run(stage, run.requests.to_arrow(), run.steps.to_arrow(), run.meta,
                                report_title=None if args.no_report else f"vllm bench serve: {path.name}",
                                report_subtitle=str(run.meta["config"].get("model_id", "")))
    except (ValueError, OutDirError) as exc:
        parser.exit(2, f"error: {exc}\n")
    except OSError as exc:
        parser.exit(2, f"error: --out {args.out}: {exc.strerror or exc}\n")
    if args.quiet:
        return 0
    with outputs_in_place(folder_complete(Path(args.out))):  # a Ctrl-C now says they are whole
        print_out(format_summary_table(summary))
        print_out(f"outputs in {escape_controls(args.out)}/")  # a newline in --out: one line
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
