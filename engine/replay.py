"""Replay a request trace on the GPU with real arrival times: ``python -m engine.replay TRACE --model NAME``.

A request joins the waiting queue at the first step boundary after its arrival time; while nothing
is queued the engine sleeps until the next arrival. Writes the same requests.parquet, steps.parquet
and summary.json as ``sim.replay``, so ``analysis.compare`` can hold the two side by side.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

from engine.replay_args import add_engine_arguments, add_trace_arguments, load_trace_for_replay


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.replay",
        description="Replay a request trace through the real engine, with real arrival times.",
    )
    add_trace_arguments(parser)
    add_engine_arguments(parser)
    g = parser.add_argument_group("GPU engine")
    g.add_argument("--load-format", default="auto", choices=["auto", "safetensors", "dummy"],
                   help="weights: the model dir's safetensors, or random (default: %(default)s)")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument("--warmup-requests", type=int, default=8, help="untimed requests run before the replay")
    g.add_argument("--step-timings", action="store_true",
                   help="add each step's host and GPU times to steps.parquet (host_prepare_ms, host_launch_ms, "
                        "host_wait_ms, gpu_forward_ms, gpu_sample_ms)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", required=True, help="output folder")
    out.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def replay(llm, trace, args) -> tuple[list, object]:
    """Feed the trace to the engine in real time; returns (request rows, the engine)."""
    from engine.core.records import request_row
    from engine.core.sampling_params import SamplingParams

    engine = llm.engine
    vocab = llm.shape.vocab_size
    requests = trace.requests
    arrivals = requests["arrival_s"].to_list()
    outputs = requests["output_tokens"].to_list()
    ids = requests["request_id"].to_list()
    # Prompts are synthesized before the clock starts, so the replay loop only queues them.
    prompts = [trace.prompt_token_ids(i, vocab, args.seed) for i in range(len(trace))]
    rows: list[tuple] = []
    gc.collect()
    gc.freeze()  # the synthesized prompts are long-lived: keep the collector's passes from walking them mid-replay
    clock = engine.clock
    engine.reset()  # a fresh scheduler and step log: the warm-up leaves no trace in the records
    clock.reset()
    next_index = 0
    num_requests = len(prompts)
    last_report = time.perf_counter()
    while next_index < num_requests or engine.has_unfinished_requests():
        now = clock.now()
        while next_index < num_requests and arrivals[next_index] <= now:
            i = next_index
            seq = engine.add_request(
                prompts[i], SamplingParams(max_tokens=outputs[i], ignore_eos=True, temperature=args.temperature),
                request_id=ids[i], arrival_s=arrivals[i],
            )
            if seq.is_finished:
                rows.append(request_row(seq))
            next_index += 1
        if not engine.has_unfinished_requests():
            clock.sleep_until(arrivals[next_index])
            continue
        _, finished = engine.step()
        rows.extend(request_row(s) for s in finished)
        if not args.quiet and time.perf_counter() - last_report > 10:
            last_report = time.perf_counter()
            print(f"  t={clock.now():.0f}s arrived {next_index}/{num_requests} finished {len(rows)}", file=sys.stderr)
    return rows, engine


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: greedy)")
    args = parser.parse_args(argv)
    try:
        trace = load_trace_for_replay(args)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    from engine.llm import LLM

    options = dict(
        load_format=args.load_format, policy=args.policy, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks, max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching, gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size, enforce_eager=args.enforce_eager, seed=args.seed,
    )
    try:
        llm = LLM(args.model, **options)
    except (ValueError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    with llm:
        if args.warmup_requests:
            from engine.core.sampling_params import SamplingParams

            warm = [[(7 * i + j) % llm.shape.vocab_size for j in range(64 + 32 * i)] for i in range(args.warmup_requests)]
            llm.generate(warm, SamplingParams(max_tokens=16, ignore_eos=True), use_tqdm=False)
        if args.step_timings:  # from here on: the warm-up's steps are not in the step log either
            llm.runner.step_timings = []
        started = time.perf_counter()
        rows, engine = replay(llm, trace, args)
        wall_s = time.perf_counter() - started
        config = {
            "model": args.model,
            "trace": args.trace,
            "offline": args.offline,
            "temperature": args.temperature,
            **{k: v for k, v in options.items()},
            "num_gpu_blocks": engine.config.num_gpu_blocks,
            "max_model_len": engine.config.max_model_len,
            "qps": args.qps,
            "time_scale": args.time_scale,
            "limit": args.limit,
            "replay_wall_s": round(wall_s, 3),
            "device": _device_name(),
        }
        write_run(Path(args.out), rows, engine.step_log, config, quiet=args.quiet, step_timings=llm.runner.step_timings)
    return 0


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


STEP_TIMING_COLUMNS = ("host_prepare_ms", "host_launch_ms", "host_wait_ms", "gpu_forward_ms", "gpu_sample_ms")


def write_run(out_dir: Path, rows: list, step_log, config: dict, quiet: bool = False, step_timings=None) -> None:
    """requests.parquet and steps.parquet, and summary.json when polars is importable (else run.json only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.core.records import requests_to_arrow

    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(requests_to_arrow(rows), out_dir / "requests.parquet")
    steps = step_log.to_arrow()
    if step_timings is not None:
        if len(step_timings) != steps.num_rows:
            raise RuntimeError(f"{len(step_timings)} step timings for {steps.num_rows} logged steps")
        for i, name in enumerate(STEP_TIMING_COLUMNS):
            steps = steps.append_column(name, pa.array([1e3 * t[i] for t in step_timings], pa.float64()))
    pq.write_table(steps, out_dir / "steps.parquet")
    (out_dir / "run.json").write_text(json.dumps({"config": config, "cost_model": "measured"}, indent=2) + "\n")
    try:
        from analysis.summarize import summarize_run_dir
    except ImportError as exc:  # the GPU image may lack polars: summarize later on any machine
        if not quiet:
            print(f"summary.json not written ({exc}); run: python -m analysis.summarize {out_dir}")
        return
    summary = summarize_run_dir(out_dir)
    if not quiet:
        from analysis.metrics import format_summary_table

        print(format_summary_table(summary))


if __name__ == "__main__":
    sys.exit(main())
