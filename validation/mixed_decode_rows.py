"""What decode rows add to a prefill step on the GPU: ``python validation/mixed_decode_rows.py [--json OUT]``.

Times whole engine steps (``sim.profile.time_step``) from states built as the profile grid builds them
(``sim.profile.StateInjector``): a prefill chunk alone, and the same chunk with decode rows beside it, the rows having
run one or four decode steps before the timed one (the grid runs one), with those steps launched ahead or not. The
median of 12 samples per case, taken one per pass over the cases. It asks whether the grid's price of a mixed step's
decode rows (0.85-1.25 ms on one H200, where serving step logs show 0.1-0.35 ms) comes from how the grid builds the
state. Needs a CUDA GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

CASES = {  # name: (prefill chunks (cached, new), decode rows, their context, decode steps before, launched ahead)
    "pre1024": ([(0, 1024)], 0, 0, 0, False),
    "pre1024+dec8 u1": ([(0, 1024)], 8, 515, 1, False),
    "pre1024+dec8 u4": ([(0, 1024)], 8, 515, 4, False),
    "pre1024+dec8 u4 ahead": ([(0, 1024)], 8, 515, 4, True),
    "pre256": ([(0, 256)], 0, 0, 0, False),
    "pre256+dec8 u1": ([(0, 256)], 8, 515, 1, False),
    "pre256+dec8 u4": ([(0, 256)], 8, 515, 4, False),
    "pre256+dec32 u1": ([(0, 256)], 32, 1027, 1, False),
    "pre256+dec32 u4": ([(0, 256)], 32, 1027, 4, False),
    "pre4096": ([(0, 4096)], 0, 0, 0, False),
    "pre4096+dec8 u1": ([(0, 4096)], 8, 515, 1, False),
    "pre4096+dec8 u4": ([(0, 4096)], 8, 515, 4, False),
}


ENGINE_OPTIONS = dict(load_format="dummy", max_num_seqs=256, max_num_batched_tokens=8192, block_size=256)
MAX_TOKENS = 8  # what each injected sequence may generate beyond the decode steps before the timed one


def longest_sequence(block_size: int) -> int:
    """The most tokens one sequence of the cases may hold: a prefill chunk, or a decode row, and its max_tokens."""
    from sim.profile import row_context

    longest = 0
    for prefill, num_decode, context, steps_before, _ in CASES.values():
        longest = max(longest, *(cached + new + MAX_TOKENS for cached, new in prefill))
        if num_decode:
            longest = max(longest, row_context(context, block_size, steps_before + 1) + steps_before + MAX_TOKENS)
    return longest


def check_args(parser, args) -> None:
    """Exit 2 with one line naming the option, before torch is imported: an unknown --model, a --max-model-len out
    of range or too short for the cases, and a --json that cannot be written were tracebacks, the last two after the
    model was built (on a GPU, after every sample was taken)."""
    from engine.core.model_config import resolve_model_dir
    from engine.options import script_options_or_exit
    from sim.files import check_output_path

    if args.samples < 1:
        parser.exit(2, f"error: --samples must be >= 1, got {args.samples}\n")
    options, _ = script_options_or_exit(parser, args.model, max_model_len=args.max_model_len, **ENGINE_OPTIONS)
    longest = longest_sequence(options.block_size)
    if args.max_model_len < longest:  # the cases' sequences did not fit: a RuntimeError after the model was built
        parser.exit(2, f"error: --max-model-len {args.max_model_len} is below the longest sequence the cases build "
                       f"({longest} tokens); expected >= {longest}\n")
    problem = args.json is not None and check_output_path(args.json, "--json",
                                                          [resolve_model_dir(args.model) / "config.json"])
    if problem:  # an empty --json was no file written, without a word; a folder failed after every sample
        parser.exit(2, f"error: {problem}\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--max-model-len", type=int, default=16384, help="as the validation runs (default: 16384)")
    parser.add_argument("--samples", type=int, default=12, help="timed samples per case (default: %(default)s)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the medians (ms) to this file")
    args = parser.parse_args(argv)
    check_args(parser, args)
    import torch

    if not torch.cuda.is_available():  # the engine fell back to the CPU without a word: many minutes, no GPU figure
        parser.exit(2, "error: this script times engine steps on a CUDA GPU and found none\n")

    from engine.llm import LLM
    from sim.files import write_text_atomic
    from sim.profile import StateInjector, row_context, time_step

    llm = LLM(args.model, max_model_len=args.max_model_len, **ENGINE_OPTIONS)
    engine, runner = llm.engine, llm.runner
    injector = StateInjector(engine, llm.shape.vocab_size)
    block_size = engine.scheduler.block_manager.block_size

    def sample(prefill, num_decode: int, context: int, steps_before: int, ahead: bool) -> float:
        runner.run_ahead = False
        for _ in range(num_decode):
            injector.add(row_context(context, block_size, steps_before + 1) - 1, 1,
                         max_tokens=steps_before + MAX_TOKENS)
        for i in range(steps_before):
            runner.run_ahead = ahead and i < steps_before - 1  # the last launches none: the prefill joins after it
            time_step(engine)
        runner.run_ahead = False
        for cached, new in prefill:
            injector.add(cached, new, max_tokens=MAX_TOKENS)
        _, elapsed_s, _ = time_step(engine)
        injector.clear()
        return elapsed_s

    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for rep in range(args.samples + 1):  # the first pass warms every shape up and is not kept
        for name, case in CASES.items():
            elapsed_s = sample(*case)
            if rep:
                samples[name].append(elapsed_s)
    medians_ms = {name: round(statistics.median(v) * 1e3, 3) for name, v in samples.items()}
    llm.close()
    for name, ms in medians_ms.items():
        print(f"{name:28s} {ms:8.3f} ms")
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps({"model": args.model, "max_model_len": args.max_model_len,
                                                       "samples": args.samples, "median_step_ms": medians_ms},
                                                      indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
