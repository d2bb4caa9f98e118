"""Split-KV decode with and without extra splits for long contexts, on equal and skewed batches (GPU).

``python benchmarks/decode_splits.py [--json OUT]``: one layer's paged decode (Qwen3-0.6B heads:
16 query, 8 KV, head_dim 128; 256-token pages), captured 20 times in a CUDA graph as the engine runs
it, timed with CUDA events over 30 replays (median, per launch).
"old" cuts every context into the batch-size rule's splits only; "long_split" adds what the engine
ran before rows were ordered (``decode_splits``: the few longest contexts over the cap get more
ranges, started first); "ordered" is what the engine runs now: that, with every row's programs started
longest context first (``decode_row_order``). A skewed batch is one long context among short ones; a
spread batch draws its contexts from a log-normal (seeded), and "equal" is a batch of the same size and
KV tokens with every context alike: the time the profile grid's equal-context points would give.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

LAUNCHES_PER_GRAPH = 20


def graph_time_us(launch) -> float:
    """Microseconds per ``launch()``: the median of 30 replays of a CUDA graph of LAUNCHES_PER_GRAPH launches, as the
    engine runs decode (no host launch cost in the timing)."""
    import torch

    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES_PER_GRAPH):
            launch()
    graph.replay()
    times = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / LAUNCHES_PER_GRAPH)
    return round(statistics.median(times), 1)


def paged_decode_inputs(lengths: list[int], heads: int, kv_heads: int, dim: int, page: int, device: str):
    """Random bf16 inputs of one layer's paged decode over contexts ``lengths``: (q, k, v, block tables, context
    lengths, out), each sequence's pages laid out one after another."""
    import torch

    need = [-(-n // page) for n in lengths]
    k = torch.randn(sum(need) + 1, kv_heads, page, dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.zeros(len(lengths), max(need), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(need):
        tables[i, :n] = torch.arange(start, start + n, device=device)
        start += n
    context = torch.tensor(lengths, dtype=torch.int32, device=device)
    q = torch.randn(len(lengths), heads, dim, device=device, dtype=torch.bfloat16)
    return q, k, v, tables, context, torch.empty_like(q)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--max-model-len", type=int, default=16384)
    args = parser.parse_args(argv)
    problem = args.json is not None and check_output_path(args.json, "--json", [])  # before any GPU work
    if problem:
        parser.exit(2, f"error: {problem}\n")
    if args.max_model_len < 1:
        parser.exit(2, f"error: --max-model-len must be >= 1, got {args.max_model_len}\n")
    import torch

    if not torch.cuda.is_available():  # torch's AssertionError or triton's ModuleNotFoundError traceback otherwise
        parser.exit(2, "error: this benchmark times CUDA kernels; it needs a CUDA GPU (and triton)\n")

    import numpy as np

    from engine.gpu.attention.triton_kernels import paged_decode
    from engine.gpu.attention.triton_kernels_host import decode_row_order, decode_splits, long_decode_rows

    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    heads, kv_heads, dim, page = 16, 8, 128, 256
    cases = [(bs, f"{short}+{long}", [short] * bs if not long else [short] * (bs - 1) + [long])
             for bs in (32, 128, 256) for short, long in ((1024, 0), (512, 16384), (1024, 16384), (256, 8192))]
    rng = np.random.default_rng(7)
    for bs in (64, 128, 160, 256):
        for median in (1000, 1500):  # log-normal spread, sigma 0.8: conversation contexts, a few long ones
            spread = np.clip(rng.lognormal(np.log(median), 0.8, bs), 16, args.max_model_len).astype(int).tolist()
            cases.append((bs, f"lognormal median {median}", spread))
            cases.append((bs, f"equal to lognormal median {median}", [sum(spread) // bs] * bs))
        cases.append((bs, "16 rows of 6000 among 1000", [1000] * (bs - 16) + [6000] * 16))
    rows = []
    for bs, label, lengths in cases:
        q, k, v, tables, context, out = paged_decode_inputs(lengths, heads, kv_heads, dim, page, dev)
        plan = decode_splits(bs, kv_heads, args.max_model_len, sms)
        rows_long = long_decode_rows(lengths, plan)
        longs = torch.tensor(rows_long, dtype=torch.int32, device=dev) if rows_long else None
        order = torch.tensor(decode_row_order(lengths), dtype=torch.int32, device=dev)
        long_split = dict(num_splits=plan.num_splits, fill_splits=plan.fill_splits, long_seqs=longs)
        variants = {  # paged_decode's keyword arguments
            "old": dict(num_splits=plan.fill_splits, fill_splits=plan.fill_splits),
            "long_split": long_split,
            "ordered": {**long_split, "row_order": order},
        }
        row = {"batch": bs, "contexts": label, "mean_context": round(sum(lengths) / bs), "longest": max(lengths),
               "splits": plan.num_splits, "fill_splits": plan.fill_splits,
               "kv_mbytes": round(2 * sum(lengths) * kv_heads * dim * 2 / 1e6, 1)}
        for name, kw in variants.items():
            # Bound now (B023): this variant's tensors and options, launched and captured in this iteration only.
            launch = functools.partial(paged_decode, q, k, v, tables, context, dim**-0.5, out=out, **kw)
            row[f"{name}_us"] = graph_time_us(launch)
        row["long_split_over_old"] = round(row["long_split_us"] / row["old_us"], 3)
        row["ordered_over_long_split"] = round(row["ordered_us"] / row["long_split_us"], 3)
        row["ordered_gbps"] = round(row["kv_mbytes"] * 1e6 / (row["ordered_us"] * 1e-6) / 1e9, 0)
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        write_text_atomic(Path(args.json),
                          json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
