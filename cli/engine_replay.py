"""Replay a request trace on the GPU with real arrival times: ``python -m engine.replay TRACE --model NAME``.

A request joins the waiting queue at the first step boundary after its arrival time; while nothing
is queued the engine sleeps until the next arrival. Writes the same folder as ``sim.replay`` (one
writer, ``analysis.runs``), so ``analysis.compare`` can hold the two side by side.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

from analysis.outdir import OutDirError, check_out_dir, folder_complete, input_files, staged_out_dir
from cli.replay_args import (
    MAX_REPLAY_SPAN_S,
    add_config_groups,
    add_output_arguments,
    add_trace_arguments,
    check_real_time_span,
    load_trace_for_replay,
    metric_percentiles_from_args,
    slos_from_args,
)
from engine.core.config import ConfigError
from engine.core.config_args import OneLineErrorParser, build_config
from engine.core.interrupt import exit_130_on_interrupt, outputs_in_place
from engine.core.messages import one_line
from engine.core.model_config import ModelShape
from engine.core.sampling_params import field_problem
from engine.llm import MAX_WARMUP_REQUESTS
from engine.options import EngineOptions, cuda_device_problem
from sim.hardware import host_info
from sim.run_kind import MEASURED

STEP_TIMING_COLUMNS = ("host_prepare_ms", "host_launch_ms", "host_wait_ms", "gpu_forward_ms", "gpu_sample_ms")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m engine.replay",
        description="Replay a request trace through the real engine, with real arrival times.",
    )
    add_trace_arguments(parser)
    g = add_config_groups(parser, EngineOptions, "GPU engine")
    g.add_argument("--warmup-requests", type=int, default=8, help="untimed requests run before the replay")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: greedy)")
    g.add_argument("--top-k", type=int, default=-1,
                   help="every request's top_k (default -1: off; Qwen3's generation config serves 20), as "
                        "sim.replay --top-k prices it")
    g.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (default 1: off; Qwen3's 0.95)")
    g.add_argument("--step-timings", action="store_true",
                   help="add each step's host and GPU times to steps.parquet (host_prepare_ms, host_launch_ms, "
                        "host_wait_ms, gpu_forward_ms, gpu_sample_ms)")
    add_output_arguments(parser, "output folder", required=True)
    return parser


def replay(llm, trace, args) -> tuple[list, object]:
    """Feed the trace to the engine in real time; returns (request rows, the engine)."""
    from engine.core.records import request_row
    from traces.requests import TraceRequests

    engine = llm.engine
    requests = TraceRequests(trace, llm.shape.vocab_size, args.seed, args.temperature, args.top_k, args.top_p)
    arrivals = requests.arrivals_s
    # Prompts are synthesized before the clock starts, so the replay loop only queues them; a request the
    # engine can never serve is rejected from its length alone, its prompt never built.
    prompts = [None if engine.scheduler.rejection_reason_for(requests.prompt_tokens[i]) else requests.prompt(i)
               for i in range(len(requests))]
    rows: list[tuple] = []
    gc.collect()
    gc.freeze()  # the synthesized prompts are long-lived: keep the collector's passes from walking them mid-replay
    clock = engine.clock
    engine.reset()  # a fresh scheduler and step log: the warm-up leaves no trace in the records
    clock.reset()
    next_index = 0
    num_requests = len(prompts)
    last_report = time.perf_counter()
    if hasattr(engine.runner, "arrivals_pending"):  # a request arrived mid-step: hold back a step launched ahead
        engine.runner.arrivals_pending = lambda: next_index < num_requests and arrivals[next_index] <= clock.now()
    while next_index < num_requests or engine.has_unfinished_requests():
        now = clock.now()
        while next_index < num_requests and arrivals[next_index] <= now:
            prompt = prompts[next_index]
            if prompt is None:
                seq = requests.reject_unservable(engine, next_index)
            else:
                seq = requests.add_to(engine, next_index, prompt)
            if seq.is_finished:
                rows.append(request_row(seq))
            next_index += 1
        if not engine.has_unfinished_requests():
            if next_index == num_requests:  # the last requests were rejected: nothing left to run or wait for
                break
            clock.sleep_until(arrivals[next_index])
            continue
        _, finished = engine.step()
        rows.extend(request_row(s) for s in finished)
        if not args.quiet and time.perf_counter() - last_report > 10:
            last_report = time.perf_counter()
            print(f"  t={clock.now():.0f}s arrived {next_index}/{num_requests} finished {len(rows)}", file=sys.stderr)
    return rows, engine


def steps_table(step_log, step_timings):
    """The step log, with each step's host and GPU times when they were recorded."""
    import pyarrow as pa

    steps = step_log.to_arrow()
    if step_timings is not None:
        if len(step_timings) != steps.num_rows:
            raise RuntimeError(f"{len(step_timings)} step timings for {steps.num_rows} logged steps")
        for i, name in enumerate(STEP_TIMING_COLUMNS):
            steps = steps.append_column(name, pa.array([1e3 * t[i] for t in step_timings], pa.float64()))
    return steps


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Checked before the model loads: a bad value must not cost a model load, nor hang the warm-up.
    # Every request's sampling options by SamplingParams' own rules (a temperature of 1e308 once
    # failed after the model had loaded, a bad top-k or top-p at the first request).
    for field in ("temperature", "top_k", "top_p"):
        problem = field_problem(field, getattr(args, field))
        if problem is not None:
            parser.exit(2, f"error: --{field.replace('_', '-')} {problem}\n")
    if not 0 <= args.warmup_requests <= MAX_WARMUP_REQUESTS:
        parser.exit(2, f"error: --warmup-requests must be an integer from 0 to {MAX_WARMUP_REQUESTS}, "
                       f"got {args.warmup_requests}\n")
    try:
        import polars  # noqa: F401  the run writer's summary needs it: fail now, not after the replay
    except ImportError:
        parser.exit(2, "error: engine.replay writes its summary with polars; install it (pip install polars)\n")
    try:
        options = build_config(EngineOptions, args)
        trace = load_trace_for_replay(args)
        trace.check_vocabulary(ModelShape.load(options.model).vocab_size)  # not only after the model loads
        args.slos = slos_from_args(args)
        args.metric_percentiles = metric_percentiles_from_args(args)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    try:
        check_real_time_span(trace, args.trace)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    span_s = float(trace.requests["arrival_s"][-1] - trace.requests["arrival_s"][0])
    first_s = float(trace.requests["arrival_s"][0])
    if first_s + span_s > MAX_REPLAY_SPAN_S:  # the replay's clock starts at 0 s: it would idle until the first one
        parser.exit(2, f"error: {args.trace}: the first request arrives at {first_s:.6g} s (arrival times count from 0 "
                       f"s, the replay's start); a real-time replay waits at most {MAX_REPLAY_SPAN_S:,} s (30 days) "
                       "for its last: shift arrival_s to start near 0 (e.g. Unix timestamps minus the first)\n")
    from analysis.report.summary_table import format_summary_table

    out_dir = Path(args.out)
    try:
        note = cpu_fallback_note(options, "engine.replay")
        # Before the note: a refused --out was a note on the CPU fallback and then the error, two lines.
        check_out_dir(out_dir, overwrite=args.overwrite, inputs=input_files(args))
    except ValueError as exc:  # OutDirError is one
        parser.exit(2, f"error: {exc}\n")
    if note:
        print(note, file=sys.stderr)
    try:
        # Made now, so a bad --out fails at once; never over an input.
        with staged_out_dir(out_dir, overwrite=args.overwrite, inputs=input_files(args)) as stage:
            summary = _replay_into(stage, options, trace, args)
    except OutDirError as exc:
        parser.exit(2, f"error: {exc}\n")
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    except (MemoryError, RuntimeError) as exc:
        line = out_of_memory_line(options.model, exc)
        if line is None:
            raise
        parser.exit(2, f"error: {line}\n")
    except OSError as exc:  # a full disk while writing: nothing was moved into place
        parser.exit(2, f"error: --out {out_dir}: {exc.strerror or exc}\n")
    if not args.quiet:
        with outputs_in_place(folder_complete(out_dir)):  # a Ctrl-C now says they are whole
            print(format_summary_table(summary))
    return 0


def cpu_fallback_note(options: EngineOptions, tool: str) -> str | None:
    """The line to print when ``tool`` (engine.replay, engine.serve) will run on the CPU only because torch sees no
    CUDA device and no device was chosen (--device auto, the default, which the engine resolves to cuda when
    available): it ran there for minutes without a word, and recorded CPU step times as if they were a GPU's. None
    otherwise. Raises ValueError (naming the option) for an option the CPU cannot take, or a --device torch does not
    see, before the model loads."""
    if options.device == "cpu":
        return None
    try:
        import torch
    except ImportError:  # the engine's own load says torch is missing
        return None
    if options.device != "auto":
        problem = cuda_device_problem(options.device, torch.cuda)
        if problem:
            raise ValueError(f"--device: {problem}")
        return None
    if torch.cuda.is_available():
        return None
    try:
        options.check_device_type("cpu")
    except ConfigError as exc:
        raise ValueError(f"--{exc.field.replace('_', '-')}: {exc}") from None
    return (f"note: torch sees no CUDA device, so {tool} runs on the CPU (slow; its step times are the CPU's); "
            "pass --device cpu to choose it without this note, or run on a GPU host")


def _replay_into(out_dir: Path, options: EngineOptions, trace, args: argparse.Namespace) -> dict:
    """Load the engine, warm it up, replay the trace and write the run folder; returns the summary."""
    from analysis.runs import write_run
    from engine.core.records import requests_to_arrow
    from engine.core.sampling_params import SamplingParams
    from engine.llm import LLM

    # generation_config 'vllm': every replayed request carries its own SamplingParams (the trace's output length with
    # ignore_eos, --temperature, greedy by default), which are used as they are, as in vLLM; the model's defaults would
    # set nothing here. Applied instead of --temperature they would change the replay's timing (top_k/top_p filters sort
    # the vocabulary of every row in every step), and a run would no longer compare with earlier runs or the simulator.
    with LLM(options.model, generation_config="vllm",
             **{k: v for k, v in vars(options).items() if k != "model"}) as llm:
        if args.warmup_requests:
            # Short prompts within max_model_len: the warm-up must never be what a small limit rejects.
            longest = max(1, min(64 + 32 * (args.warmup_requests - 1), llm.config.max_seq_len - 16))
            warm = [[(7 * i + j) % llm.shape.vocab_size for j in range(min(64 + 32 * i, longest))]
                    for i in range(args.warmup_requests)]
            llm.generate(warm, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        if args.step_timings:  # from here on: the warm-up's steps are not in the step log either
            llm.runner.step_timings = []
        started = time.perf_counter()
        rows, engine = replay(llm, trace, args)
        wall_s = time.perf_counter() - started
        config = {
            **vars(options),
            **llm.ran_with,  # 'auto' resolved: what ran, not what was left to the engine
            "trace": args.trace,
            "offline": args.offline,
            "temperature": args.temperature,
            # Only when on, as sim.replay records its own (SimConfig.describe_sampling): analysis.compare lists them
            # among the config differences where a simulation sampled otherwise.
            **({"top_k": args.top_k} if args.top_k > 0 else {}),
            **({"top_p": args.top_p} if args.top_p < 1.0 else {}),
            "num_gpu_blocks": engine.config.num_gpu_blocks,
            "max_model_len": engine.config.max_model_len,
            "qps": args.qps,
            "time_scale": args.time_scale,
            "limit": args.limit,
            "replay_wall_s": round(wall_s, 3),
            "device": _device_name(llm.runner.device),
            "host": host_info(),
        }
        steps = steps_table(engine.step_log, llm.runner.step_timings)
        return write_run(
            out_dir, requests_to_arrow(rows), steps,
            {"cost_model": MEASURED, "trace": str(args.trace), "config": config},
            report_title=None if args.no_report else f"GPU replay of {Path(args.trace).name}",
            report_subtitle=f"{options.model} on {config['device']}, policy {options.policy}",
            slos=args.slos,
            metric_percentiles=args.metric_percentiles,
        )


def out_of_memory_line(model: str, exc: BaseException) -> str | None:
    """The error line for an allocation the device or host could not make (torch raises RuntimeError subclasses for
    both): the options ask for more KV cache, activations or per-sequence buffers than there is memory, a bad input,
    not a bug; None for any other error. engine.serve gets the engine process's error as a RuntimeError of its text.
    --max-num-seqs is named first: it sizes the per-sequence buffers, and --max-num-seqs 10**9 on the CPU asked for
    1 TB of them while the line told the user to lower three other options."""
    text = str(exc).lower()
    if not (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in text or "out of memory" in text):
        return None
    return (f"{model} does not fit in memory with these options ({one_line(exc)[:200]}); lower --max-num-seqs, "
            "--num-gpu-blocks, --max-num-batched-tokens or --gpu-memory-utilization")


def _device_name(device) -> str:
    """The GPU's name, or "cpu": of the device the engine ran on (a --device cpu run on a GPU host was recorded as
    run on the GPU)."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
