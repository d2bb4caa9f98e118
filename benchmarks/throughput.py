"""Offline throughput on nano-vLLM's benchmark workload: ``python benchmarks/throughput.py``.

Qwen3-0.6B shape with dummy weights, 256 sequences, prompt lengths and max_tokens each uniform in
[100, 1024] drawn with random.seed(0) (prompts first, then max_tokens, as nano-vLLM's bench.py),
token ids uniform in [0, 10000], ignore_eos, temperature 0.6, max_model_len 4096. Prints output
tokens per second, where a step's time goes, and (with --peer) transformers' continuous batching
on a subset of the same workload, measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import SamplingParams  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402

# The workload's lengths are drawn uniform in [MIN_LEN, --max-input-len] and [MIN_LEN, --max-output-len] and its
# token ids uniform in [0, MAX_TOKEN_ID], as nano-vLLM's bench.py draws them.
MIN_LEN = 100
MAX_TOKEN_ID = 10000


def workload(num_seqs: int, max_input_len: int, max_output_len: int, seed: int = 0, top_k_every: int = 0):
    """``top_k_every`` N > 0: every N-th request also asks for top_k 50 and top_p 0.9 (a batch of filtered and
    unfiltered rows, sampled in two passes); the lengths drawn are the same."""
    random.seed(seed)
    prompts = [[random.randint(0, MAX_TOKEN_ID) for _ in range(random.randint(MIN_LEN, max_input_len))]
               for _ in range(num_seqs)]
    params = [
        SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=random.randint(MIN_LEN, max_output_len))
        for _ in range(num_seqs)
    ]
    if top_k_every > 0:
        params = [dataclasses.replace(p, top_k=50, top_p=0.9) if i % top_k_every == 0 else p
                  for i, p in enumerate(params)]
    return prompts, params


def engine_options(args) -> dict:
    """The options ``engine.LLM`` is given (those left out take the engine's defaults)."""
    options = dict(load_format="dummy", max_model_len=args.max_model_len, policy=args.policy,
                   enforce_eager=args.enforce_eager, tensor_parallel_size=args.tensor_parallel_size,
                   run_ahead=not args.no_run_ahead)
    for name in ("block_size", "max_num_batched_tokens", "max_cuda_graph_tokens"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def check_args(parser: argparse.ArgumentParser, args) -> None:
    """Exit 2 with one line naming the option for what the engine or the workload cannot run with: each was a
    traceback after torch was imported and the model built (or an out-of-range token id on the GPU), or requests
    silently cut or rejected, the tokens per second then of a smaller workload than the one printed."""
    from engine.options import script_options_or_exit

    minimums = {"top_k_every": 0, "num_seqs": 1, "max_input_len": MIN_LEN, "max_output_len": MIN_LEN,
                "peer_num_seqs": 1}
    for name, minimum in minimums.items():  # 0 divided by zero after the run; below MIN_LEN an empty range
        if getattr(args, name) < minimum:
            why = f" (lengths are drawn uniform in [{MIN_LEN}, N], as nano-vLLM's bench.py)" if minimum > 1 else ""
            parser.exit(2, f"error: --{name.replace('_', '-')} must be >= {minimum}{why}, got {getattr(args, name)}\n")
    options, shape = script_options_or_exit(parser, args.model, **engine_options(args))
    if shape.vocab_size <= MAX_TOKEN_ID:
        parser.exit(2, f"error: --model {args.model}: vocab_size {shape.vocab_size}; the workload's token ids go up to "
                       f"{MAX_TOKEN_ID}, expected a vocab_size > {MAX_TOKEN_ID}\n")
    try:
        options.check_model(shape)
    except ValueError as exc:  # the heads, intermediate size or vocabulary not divisible by the ranks
        parser.exit(2, f"error: --tensor-parallel-size: {exc}\n")
    # As vLLM's benchmark_throughput, every request must fit whole: the engine would cut a longer one at
    # max_model_len (or reject its prompt), and the figure would be of fewer tokens than the workload's.
    longest = args.max_input_len + args.max_output_len
    if longest > args.max_model_len:
        parser.exit(2, f"error: --max-model-len {args.max_model_len} is below the longest request the workload may "
                       f"draw (--max-input-len {args.max_input_len} + --max-output-len {args.max_output_len} = "
                       f"{longest} tokens); expected >= {longest}, or lower lengths\n")
    if options.policy == "nano" and args.max_input_len > options.max_num_batched_tokens:
        parser.exit(2, f"error: --max-input-len {args.max_input_len} is above --max-num-batched-tokens "
                       f"{options.max_num_batched_tokens}, and --policy nano does not chunk prefills: longer prompts "
                       "would be rejected\n")


def run_engine(args, prompts, params) -> dict:
    import torch

    from engine import LLM

    started = time.perf_counter()
    llm = LLM(args.model, **engine_options(args))
    init_s = time.perf_counter() - started
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up

    engine = llm.engine
    runner = llm.runner
    timings = runner.timings
    for name in ("num_steps", "num_graph_steps", "num_piecewise_steps", "num_prepared_steps", "num_ran_ahead_steps",
                 "num_discarded_ahead_steps"):
        setattr(timings, name, 0)
    if args.no_prepare_ahead:
        runner.prepare_ahead = False
    for name in ("prepare_s", "execute_s", "forward_s", "sample_s"):
        setattr(timings, name, 0.0)
    seqs = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    schedule_s = postprocess_s = 0.0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        batch = engine.begin_step()
        t1 = time.perf_counter()
        output = runner.run(batch)
        t2 = time.perf_counter()
        engine.end_step(batch, output)
        t3 = time.perf_counter()
        schedule_s += t1 - t0
        postprocess_s += t3 - t2
    wall_s = time.perf_counter() - start
    output_tokens = sum(s.num_completion_tokens for s in seqs)
    num_steps = timings.num_steps
    # Requests that did not get every token asked for (the sequence alone filled the KV cache, or was rejected).
    short: dict[str, int] = {}
    for seq in seqs:
        reason = getattr(seq.finish_reason, "value", str(seq.finish_reason))
        if reason != "length":
            short[reason] = short.get(reason, 0) + 1
    result = {
        "output_tokens": output_tokens,
        "num_requests_short": short,
        "prompt_tokens": sum(len(p) for p in prompts),
        "wall_s": wall_s,
        "output_tok_per_s": output_tokens / wall_s,
        "num_steps": num_steps,
        "num_graph_steps": timings.num_graph_steps,
        "num_piecewise_steps": timings.num_piecewise_steps,
        "num_prepared_steps": timings.num_prepared_steps,
        "run_ahead": runner.run_ahead,
        "num_ran_ahead_steps": timings.num_ran_ahead_steps,
        "num_discarded_ahead_steps": timings.num_discarded_ahead_steps,
        "num_gpu_blocks": runner.num_gpu_blocks,
        "init_s": init_s,
        "per_step_ms": {
            "schedule": 1e3 * schedule_s / num_steps,
            "prepare_inputs": 1e3 * timings.prepare_s / num_steps,
            "forward_gpu": 1e3 * timings.forward_s / num_steps,
            "sample_gpu": 1e3 * timings.sample_s / num_steps,
            "execute_host_wall": 1e3 * timings.execute_s / num_steps,
            "postprocess": 1e3 * postprocess_s / num_steps,
            "total": 1e3 * wall_s / num_steps,
        },
    }
    llm.close()
    return result


def run_peer(args, prompts, params) -> dict:
    """transformers' continuous batching (generate_batch, paged sdpa) on the first --peer-num-seqs requests."""
    import torch
    import transformers
    from transformers import GenerationConfig

    from engine.core.model_config import resolve_model_dir

    config = transformers.AutoConfig.from_pretrained(str(resolve_model_dir(args.model)))
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="paged|sdpa",
                                                          dtype=torch.bfloat16)
    model = model.to("cuda").eval()
    n = args.peer_num_seqs
    subset_prompts = prompts[:n]
    max_new = max(p.max_tokens for p in params[:n])
    gen_config = GenerationConfig(max_new_tokens=max_new, do_sample=True, temperature=0.6, eos_token_id=-1,
                                  pad_token_id=0)
    model.generate_batch(inputs=[[1, 2, 3, 4]],
                         generation_config=GenerationConfig(max_new_tokens=8, eos_token_id=-1, pad_token_id=0),
                         progress_bar=False)
    torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = model.generate_batch(inputs=subset_prompts, generation_config=gen_config, progress_bar=False)
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    return {"num_seqs": n, "max_new_tokens": max_new, "output_tokens": tokens, "wall_s": wall_s,
            "output_tok_per_s": tokens / wall_s, "transformers": transformers.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/throughput.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="shipped config name or model dir (dummy weights)")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-input-len", type=int, default=1024)
    parser.add_argument("--max-output-len", type=int, default=1024)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--policy", default="mixed", choices=["mixed", "nano"])
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--max-cuda-graph-tokens", type=int, default=None,
                        help="largest prefill/mixed step run as piecewise CUDA graphs (0: eagerly; default: the "
                             "engine's)")
    parser.add_argument("--no-prepare-ahead", action="store_true",
                        help="plan every decode step after the step before it (the runner's NextDecode off)")
    parser.add_argument("--no-run-ahead", action="store_true",
                        help="launch no decode step before the one before it is postprocessed (the engine's "
                             "run_ahead off)")
    parser.add_argument("--top-k-every", type=int, default=0, metavar="N",
                        help="every N-th request also samples with top_k 50, top_p 0.9 (default 0: none)")
    parser.add_argument("--peer", action="store_true", help="also time transformers' generate_batch on a subset")
    parser.add_argument("--peer-num-seqs", type=int, default=32,
                        help="requests given to the peer (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    parser.add_argument("--cpu", action="store_true",
                        help="run where no CUDA GPU is found, on the CPU (slowly: the default workload takes many "
                        "minutes, and its figure is not the GPU's)")
    args = parser.parse_args(argv)
    check_args(parser, args)  # before torch is imported or a GPU touched
    from engine.core.model_config import resolve_model_dir
    from sim.files import check_output_path, write_text_atomic

    problem = args.json is not None and check_output_path(args.json, "--json",
                                                          [resolve_model_dir(args.model) / "config.json"])
    if problem:  # a folder or an unwritable path failed after the whole run
        parser.exit(2, f"error: {problem}\n")

    import torch

    if not torch.cuda.is_available() and not args.cpu:  # the engine fell back to the CPU without a word, for hours
        parser.exit(2, "error: this benchmark times the engine on a CUDA GPU and found none; pass --cpu to run it on "
                       "the CPU anyway (slowly)\n")
    prompts, params = workload(args.num_seqs, args.max_input_len, args.max_output_len, top_k_every=args.top_k_every)
    results = {"workload": {"num_seqs": args.num_seqs, "top_k_every": args.top_k_every,
                            "prompt_tokens": sum(map(len, prompts)),
                            "max_output_tokens": sum(p.max_tokens for p in params)}}
    results["engine"] = engine = run_engine(args, prompts, params)
    print(f"engine: {engine['output_tokens']} output tokens in {engine['wall_s']:.2f} s = "
          f"{engine['output_tok_per_s']:.0f} tok/s ({engine['num_steps']} steps, "
          f"{engine['num_graph_steps']} graph replays, {engine['num_ran_ahead_steps']} launched ahead, "
          f"{engine['num_gpu_blocks']} KV blocks)")
    if engine["num_requests_short"]:
        print(f"WARNING: requests that did not get every token asked for: {engine['num_requests_short']}")
    print("per step (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in engine["per_step_ms"].items()))
    if args.peer:
        try:
            results["peer"] = peer = run_peer(args, prompts, params)
            print(f"peer (transformers {peer['transformers']} generate_batch, first {peer['num_seqs']} requests, "
                  f"max_new_tokens {peer['max_new_tokens']}): {peer['output_tok_per_s']:.0f} tok/s")
            print(f"ratio engine / peer: {engine['output_tok_per_s'] / peer['output_tok_per_s']:.1f}x")
        except Exception as exc:  # the peer is optional; say why it did not run
            results["peer_error"] = f"{type(exc).__name__}: {exc}"
            print(f"peer not measured: {results['peer_error']}")
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
