"""Build the validation traces from ../shared/traces (kept out of git; regenerate with this script).

- bench_workload.parquet: the throughput benchmark's 256 requests (nano-vLLM's workload), all at t=0;
- azure_conv_slice.parquet: a contiguous slice of the Azure 2023 conversation trace;
- mooncake_slice.parquet: a contiguous slice of the Mooncake conversation trace (prefix reuse via hash ids);
- azure_conv_calibration.parquet, mooncake_calibration.parquet: later slices of the same traces, disjoint
  from the validation slices, replayed on the GPU only to calibrate the cost model on serving steps;
- prefill_heavy.parquet: synthesised, prompts ~2,048 tokens (lognormal, sigma 0.4) and outputs ~28
  (geometric), the shape where prefill and mixed steps dominate (benchmarks/serving.py's trace, 4,000
  requests, seed 11: not the benchmark's seed 7);
- decode_heavy.parquet: synthesised, short prompts (~300 tokens, lognormal, sigma 0.6) and long outputs (~350,
  lognormal, sigma 0.6) arriving in bursts (gamma gaps, CV 2): the shape where large decode batches dominate and
  arrivals are not Poisson (4,000 requests, seed 13); decode_heavy_calibration.parquet, the same shape drawn with
  another seed (17), replayed only to calibrate decode steps of 64-128 rows, which the Azure calibration slice
  seldom forms.
- heldout_longctx.parquet, heldout_longout.parquet: shapes no profile point or calibration was chosen for (made
  for the fourteenth session's held-out runs): long contexts (prompts ~6,000 tokens, lognormal sigma 0.6, up to
  14,000; outputs ~150), where decode steps read more KV than the profile grid measured; long outputs (prompts ~300,
  outputs ~800, lognormal sigma 0.6, up to 4,000) arriving in bursts (gamma gaps, CV 2).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polars as pl  # noqa: E402

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import existing_parent  # noqa: E402
from traces.convert import ConvertOptions, convert  # noqa: E402
from traces.files import output_file_problem  # noqa: E402
from traces.schema import save_trace  # noqa: E402


def bench_workload(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from throughput import workload

    prompts, params = workload(256, 1024, 1024)
    df = pl.DataFrame({
        "request_id": [f"bench-{i}" for i in range(len(prompts))],
        "arrival_s": [0.0] * len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "output_tokens": [p.max_tokens for p in params],
    })
    save_trace(df, out)


def synthesised(out: Path, options: list[str], num_requests: int = 4000) -> None:
    """A traces.synth trace at ``out``, made anew."""
    from traces.synth import main as synth

    out.unlink(missing_ok=True)  # synth refuses to replace a file; this folder is regenerated whole
    synth(["-o", str(out), "--num-requests", str(num_requests), *options])


# benchmarks/serving.py's shape, with another seed (11, not the benchmark's 7)
PREFILL_HEAVY = ["--qps", "50", "--prompt-dist", "lognormal:median=2048,sigma=0.4,max=8000",
                 "--output-dist", "geometric:mean=28,max=512", "--seed", "11"]
DECODE_HEAVY = ["--qps", "20", "--arrival", "gamma", "--cv", "2",
                "--prompt-dist", "lognormal:median=300,sigma=0.6,max=4000",
                "--output-dist", "lognormal:median=350,sigma=0.6,max=2000", "--seed", "13"]
DECODE_HEAVY_CALIBRATION = [*DECODE_HEAVY[:-1], "17"]  # the same shape, other draws: disjoint from decode_heavy
HELDOUT_LONG_CONTEXT = ["--qps", "10", "--prompt-dist", "lognormal:median=6000,sigma=0.6,max=14000",
                        "--output-dist", "lognormal:median=150,sigma=0.8,max=1000", "--seed", "11"]
HELDOUT_LONG_OUTPUT = ["--qps", "10", "--arrival", "gamma", "--cv", "2",
                       "--prompt-dist", "lognormal:median=300,sigma=0.8,max=4000",
                       "--output-dist", "lognormal:median=800,sigma=0.6,max=4000", "--seed", "12"]


def slice_of(trace, start: int, count: int, out: Path) -> None:
    requests = trace.requests.slice(start, count)
    requests = requests.with_columns(pl.col("arrival_s") - requests["arrival_s"][0])
    save_trace(requests, out, hash_block_size=trace.hash_block_size)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared" / "traces"), help="folder of the public traces")
    parser.add_argument("--out", default=str(ROOT / "validation" / "traces"))
    parser.add_argument("--azure-start", type=int, default=2000)
    parser.add_argument("--azure-count", type=int, default=6000)
    parser.add_argument("--mooncake-start", type=int, default=0)
    parser.add_argument("--mooncake-count", type=int, default=600)
    parser.add_argument("--azure-calibration-start", type=int, default=12000)
    parser.add_argument("--mooncake-calibration-start", type=int, default=1000)
    args = parser.parse_args(argv)
    counts = {name: getattr(args, name) for name in vars(args) if name.endswith(("_start", "_count"))}
    bad = [f"--{name.replace('_', '-')} {value}" for name, value in counts.items()
           if value < (1 if name.endswith("_count") else 0)]
    if bad:  # a negative count made empty slices at exit 0
        parser.exit(2, f"error: {bad[0]}: expected a count >= 1 (starts >= 0)\n")
    for fmt in ("azure", "mooncake"):  # both slices take --FMT-count requests
        start, calibration, count = (counts[f"{fmt}_{key}"] for key in ("start", "calibration_start", "count"))
        if abs(start - calibration) < count:  # calibrating on the requests it is then validated on, unsaid
            parser.exit(2, f"error: --{fmt}-calibration-start {calibration} with --{fmt}-start {start} and "
                           f"--{fmt}-count {count}: the slices overlap; expected the calibration slice disjoint "
                           "from the validation one\n")
    for name in ("azure_llm_2023_conv.csv", "mooncake_conversation.jsonl"):
        if not (Path(args.shared) / name).is_file():  # a TraceError traceback after the first trace was written
            parser.exit(2, f"error: --shared {args.shared}: no {name}; expected the folder of the public traces\n")
    out = Path(args.out)
    blocked = out if out.exists() else existing_parent(out)
    if blocked is not None and not blocked.is_dir():  # a FileExistsError traceback
        parser.exit(2, f"error: --out {out}: {blocked} is a file; expected the folder the traces go to\n")
    inside = output_file_problem(out / "bench_workload.parquet")  # traces.synth refused it only after the slices
    if inside is not None:
        parser.exit(2, f"error: --out {out}: a trace written there {inside}\n")
    shared = Path(args.shared)
    sources = {"azure": shared / "azure_llm_2023_conv.csv", "mooncake": shared / "mooncake_conversation.jsonl"}
    traces = {fmt: convert(fmt, path, ConvertOptions())[0] for fmt, path in sources.items()}
    slices = {  # file -> (trace format, its start option, start, count)
        "azure_conv_slice.parquet": ("azure", "--azure-start", args.azure_start, args.azure_count),
        "mooncake_slice.parquet": ("mooncake", "--mooncake-start", args.mooncake_start, args.mooncake_count),
        "azure_conv_calibration.parquet": ("azure", "--azure-calibration-start", args.azure_calibration_start,
                                           args.azure_count),
        "mooncake_calibration.parquet": ("mooncake", "--mooncake-calibration-start", args.mooncake_calibration_start,
                                         args.mooncake_count),
    }
    for fmt, option, start, count in slices.values():
        # A slice past the end was an IndexError traceback (after the first traces were written), one reaching past
        # it a shorter slice than asked for, at exit 0.
        size = traces[fmt].requests.height
        if start + count > size:
            parser.exit(2, f"error: {option} {start} with --{fmt}-count {count}: {sources[fmt]} holds "
                           f"{size} requests; expected start + count <= {size}\n")
    out.mkdir(parents=True, exist_ok=True)
    bench_workload(out / "bench_workload.parquet")
    for name, (fmt, _, start, count) in slices.items():
        slice_of(traces[fmt], start, count, out / name)
    synthesised(out / "prefill_heavy.parquet", PREFILL_HEAVY)
    synthesised(out / "decode_heavy.parquet", DECODE_HEAVY)
    synthesised(out / "decode_heavy_calibration.parquet", DECODE_HEAVY_CALIBRATION)
    synthesised(out / "heldout_longctx.parquet", HELDOUT_LONG_CONTEXT, 1200)
    synthesised(out / "heldout_longout.parquet", HELDOUT_LONG_OUTPUT, 1500)
    for path in sorted(out.glob("*.parquet")):
        df = pl.read_parquet(path)
        print(f"{path.name}: {df.height} requests, span {df['arrival_s'].max():.1f} s, "
              f"mean prompt {df['prompt_tokens'].mean():.0f}, mean output {df['output_tokens'].mean():.0f}")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
