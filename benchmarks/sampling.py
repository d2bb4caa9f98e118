"""Sampling time per step on the GPU, by the sampling options a batch asks for (GPU).

``python benchmarks/sampling.py [--json OUT]``: ``engine.gpu.layers.sampler.sample`` on bf16 logits of
Qwen3's 151,936-token vocabulary (random, scaled as a model's), batches of 32-256 rows, timed with CUDA
events (median of 30 calls after 5 warm-ups, host launch included as the engine pays it). Options: greedy,
temperature alone (one pass of the Gumbel-max kernel), Qwen3's generation_config defaults (temperature 0.6,
top_k 20, top_p 0.95: every request of a served Qwen3 that leaves them out), Llama 3's (temperature 0.6,
top_p 0.9), and half of the rows with top_k 50, top_p 0.9. Per case: "sample_ms", what ``sample`` takes
(the engine's path); with filters, "floors_ms" (a floor per row by ``filter_floors``' search, then the one
pass) and "sort_ms" (the torch path over every row: sort, softmax, cumulative sum, scatter; what a batch whose
rows all asked for filters took before the floors). "same_tokens": the two drew the same tokens; random bf16
logits tie often, and at the top_p boundary the sort splits a tie the floor keeps whole, so False is expected
there (tests/engine/sampling_checks.py checks the difference is only that).
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

VOCAB = 151_936
OPTIONS = {  # name: (temperature, top_k, top_p, fraction of rows that ask for them; the others: temperature 0.6)
    "greedy": (0.0, -1, 1.0, 1.0),
    "temperature 0.6": (0.6, -1, 1.0, 1.0),
    "qwen3 defaults (top_k 20, top_p 0.95)": (0.6, 20, 0.95, 1.0),
    "llama3 defaults (top_p 0.9)": (0.6, -1, 0.9, 1.0),
    "half the rows top_k 50, top_p 0.9": (0.6, 50, 0.9, 0.5),
}


def time_ms(torch, fn) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return round(statistics.median(times), 4)


def floors_then_draw(filter_floors, gumbel_argmax, logits, params):
    found = filter_floors(logits, params.temperatures, params.top_ks, params.top_ps)
    return gumbel_argmax(logits, params.temperatures, params.words, found)


def floor_configs(torch, logits, params) -> list[dict]:
    from engine.gpu.layers.sampling_kernels import filter_floors

    timed = []
    for pivots in (2, 4, 8, 16):
        for block in (1024, 2048, 4096):
            for num_warps in (4, 8, 16):
                floors = functools.partial(filter_floors, logits, params.temperatures, params.top_ks, params.top_ps,
                                           pivots=pivots, block=block, num_warps=num_warps)
                timed.append({"pivots": pivots, "block": block, "num_warps": num_warps,
                              "floors_only_ms": time_ms(torch, floors)})
    return sorted(timed, key=lambda t: t["floors_only_ms"])[:6]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/sampling.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="32,128,256", help="batch sizes, comma-separated (default %(default)s)")
    parser.add_argument("--floor-configs", action="store_true",
                        help="also time the floors' search shapes (pivots per pass, block, warps) on the filtered "
                        "options, and torch.topk(k=20) beside them")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    args = parser.parse_args(argv)
    try:
        batch_sizes = [int(x) for x in args.rows.split(",")]
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError
    except ValueError:
        parser.exit(2, f"error: --rows: expected positive integers separated by commas, got {args.rows!r}\n")
    import torch

    if not torch.cuda.is_available():
        parser.exit(2, "error: this benchmark times the sampler on a CUDA GPU and found none\n")
    from engine.gpu.layers.sampler import MASK32, SamplingTensors, sample, sample_reference
    from engine.gpu.layers.sampling_kernels import filter_floors, gumbel_argmax

    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for rows in batch_sizes:
        logits = (torch.randn(rows, VOCAB, generator=gen, device="cuda") * 4).bfloat16()
        for name, (temperature, top_k, top_p, fraction) in OPTIONS.items():
            asked = [r < fraction * rows for r in range(rows)]
            params = SamplingTensors([temperature if a else 0.6 for a in asked], [top_k if a else -1 for a in asked],
                                     [top_p if a else 1.0 for a in asked],
                                     [(7, r, MASK32) for r in range(rows)], torch.device("cuda"))
            entry = {"rows": rows, "options": name, "sample_ms": time_ms(torch, functools.partial(sample, logits,
                                                                                                   params))}
            if params.filtered_rows:
                sort = functools.partial(sample_reference, logits, params.temperatures, params.words, params.top_ks,
                                         params.top_ps)
                floors = functools.partial(floors_then_draw, filter_floors, gumbel_argmax, logits, params)
                entry["floors_ms"] = time_ms(torch, floors)
                entry["sort_ms"] = time_ms(torch, sort)
                entry["same_tokens"] = bool(torch.equal(floors(), sort()))
            results.append(entry)
            print(json.dumps(entry))
            if args.floor_configs and params.filtered_rows:
                entry["floor_configs"] = floor_configs(torch, logits, params)
                print(json.dumps(entry["floor_configs"]))
        if args.floor_configs:
            topk = functools.partial(logits.topk, 20, dim=-1)
            results.append({"rows": rows, "torch_topk20_ms": time_ms(torch, topk)})
    if args.json:
        from sim.files import write_text_atomic

        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps({"device": torch.cuda.get_device_name(), "vocab": VOCAB,
                                                       "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
