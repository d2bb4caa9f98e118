"""The engine process's own work per step beyond ``engine.step()`` (``engine.server.engine_process``), CPU only.

A scripted runner (no model) decodes ``--requests`` requests at once; after each step the loop's own
``after_step`` runs (new tokens as update tuples, the step's ``StepStats``), its message pickled as the pipe
would. Prints CPU ms per step of ``engine.step()`` and of the extras
(medians of ``--repeat`` runs), and what pickling one step's updates costs as tuples vs ``Update``
dataclasses (why they travel as tuples).

    python benchmarks/server_loop.py --requests 128 --repeat 3 [--json OUT]
"""

from __future__ import annotations

import json
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config import EngineConfig  # noqa: E402
from engine.core.config_args import OneLineErrorParser  # noqa: E402
from engine.core.llm_engine import LLMEngine  # noqa: E402
from engine.core.runner import RunnerOutput  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.server.engine_process import Update, _Loop  # noqa: E402


class _ScriptedRunner:
    def run(self, batch) -> RunnerOutput:
        return RunnerOutput([(s.token_ids[-1] + 1) % 90 for s in batch.seqs])

    def release(self, seqs) -> None:
        pass


class _PickleOnly:
    """Stands for the pipe to the server's process: pickles what would be sent."""

    def send(self, message) -> None:
        pickle.dumps(message)


def one_run(num_requests: int, max_tokens: int) -> tuple[float, float, int]:
    config = EngineConfig(max_num_seqs=256, max_num_batched_tokens=8192, block_size=16).resolved(
        num_gpu_blocks=100_000, max_model_len=4096)
    engine = LLMEngine(config, _ScriptedRunner(), eos_token_ids=[99])
    loop = _Loop(engine, None, _PickleOnly())
    for key in range(num_requests):
        loop.add(key, [[1, 2, 3 + key]], [SamplingParams(max_tokens=max_tokens + key, ignore_eos=True)], time.time())
    step_s = extras_s = 0.0
    num_steps = 0
    while engine.has_unfinished_requests():
        t0 = time.process_time()
        batch, finished = engine.step()
        t1 = time.process_time()
        loop.after_step(batch, finished)
        step_s += t1 - t0
        extras_s += time.process_time() - t1
        num_steps += 1
    return 1e3 * step_s / num_steps, 1e3 * extras_s / num_steps, num_steps


def pickle_ms(num_requests: int, repeat: int = 200) -> tuple[float, float]:
    tuples = [(1, 0, [5]) for _ in range(num_requests)]
    updates = [Update(*t) for t in tuples]
    out = []
    for message in (tuples, updates):
        start = time.process_time()
        for _ in range(repeat):
            pickle.dumps(message)
        out.append(1e3 * (time.process_time() - start) / repeat)
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/server_loop.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    # As typed (not a Path): check_output_path reads a trailing '/' as a folder, which Path would drop.
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the figures here")
    args = parser.parse_args(argv)
    for name in ("requests", "max_tokens", "repeat"):  # 0 divided by zero after the runs
        if getattr(args, name) < 1:
            parser.exit(2, f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}\n")
    from sim.files import check_output_path, write_text_atomic

    # Before the runs: a folder was an IsADirectoryError traceback after them, and --json "" wrote nothing at exit 0.
    problem = args.json is not None and check_output_path(args.json, "--json", [])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    runs = [one_run(args.requests, args.max_tokens) for _ in range(args.repeat)]
    tuple_ms, dataclass_ms = pickle_ms(args.requests)
    result = {
        "requests": args.requests,
        "steps": runs[0][2],
        "engine_step_cpu_ms": statistics.median(r[0] for r in runs),
        "loop_extras_cpu_ms": statistics.median(r[1] for r in runs),
        "pickle_updates_as_tuples_ms": tuple_ms,
        "pickle_updates_as_dataclasses_ms": dataclass_ms,
    }
    print(json.dumps(result, indent=2))
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
