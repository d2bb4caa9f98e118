"""Serving capacity before and after piecewise graphs: ``python benchmarks/serving.py --qps 100,115 --json OUT``.

Replays a prefill-heavy synthetic trace (``traces.synth``: prompts lognormal, median 2,048 tokens, outputs
geometric, mean 28; seed 7) on the GPU with ``engine.replay`` at each QPS of ``--qps``, once with prefill and
mixed steps run eagerly (``--max-cuda-graph-tokens 0``, the engine before issue 16) and once with piecewise
CUDA graphs (the default), alternating the two at each QPS so that both see the same host. Reports per run
TTFT p50/p90, TPOT p50 and output throughput, and per engine the highest QPS tried whose TTFT p90 met
``--ttft-p90-ms``: a grid, not a bisection, so choose QPS values around the expected capacity
(``python -m analysis.capacity TRACE --slo ttft_p90=1s`` predicts it). Needs a CUDA GPU; qwen3-0.6b, dummy weights.

First, each engine replays the trace's first ``--warmup-requests`` at the highest rate, unmeasured: on a
fresh machine Triton compiles each kernel variant the first time a step needs it (seconds each), which
made the first measured run's TTFT spike; its on-disk cache then serves every later process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {"eager-prefill": ["--max-cuda-graph-tokens", "0"], "piecewise": []}


def make_trace(path: Path, num_requests: int) -> None:
    subprocess.run([sys.executable, "-m", "traces.synth", "-o", str(path), "--num-requests", str(num_requests),
                    "--qps", "50", "--prompt-dist", "lognormal:median=2048,sigma=0.4,max=8000",
                    "--output-dist", "geometric:mean=28,max=512", "--seed", "7"], cwd=REPO, check=True,
                   capture_output=True)


def replay(trace: Path, qps: float, extra: list[str], out: Path, model: str) -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "engine.replay", str(trace), "--qps", str(qps), "--model", model,
                    "--load-format", "dummy", "--max-model-len", "16384", "--out", str(out), "--quiet",
                    "--no-report", *extra], cwd=REPO, check=True)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "qps": qps, "wall_s": round(time.perf_counter() - started, 1),
        "ttft_ms_p50": summary["ttft_ms"]["p50"], "ttft_ms_p90": summary["ttft_ms"]["p90"],
        "tpot_ms_p50": summary["tpot_ms"]["p50"], "output_throughput": summary["output_throughput"],
        "num_finished": summary["num_finished"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/serving.py", description=__doc__.splitlines()[0])
    parser.add_argument("--qps", required=True, help="comma-separated request rates to replay at")
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--ttft-p90-ms", type=float, default=1000.0)
    parser.add_argument("--warmup-requests", type=int, default=300,
                        help="unmeasured replay of this many requests per engine first (0: none)")
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    try:
        rates = [float(q) for q in args.qps.split(",")]
    except ValueError:
        parser.exit(2, f"error: --qps: expected comma-separated numbers, got {args.qps!r}\n")
    if args.num_requests < 1 or args.warmup_requests < 0:
        parser.exit(2, "error: --num-requests must be >= 1 and --warmup-requests >= 0\n")
    results: dict = {"model": args.model, "num_requests": args.num_requests, "ttft_p90_ms_limit": args.ttft_p90_ms,
                     "warmup_requests": args.warmup_requests, "runs": {mode: [] for mode in MODES}}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "prefill_heavy.parquet"
        make_trace(trace, args.num_requests)
        if args.warmup_requests:
            for mode, extra in MODES.items():
                warm = replay(trace, max(rates), [*extra, "--limit", str(args.warmup_requests)],
                              Path(tmp) / f"warmup-{mode}", args.model)
                results.setdefault("warmup_wall_s", {})[mode] = warm["wall_s"]
        for qps in rates:
            for mode, extra in MODES.items():
                row = replay(trace, qps, extra, Path(tmp) / f"{mode}-{qps}", args.model)
                results["runs"][mode].append(row)
                print(f"{mode:14s} {qps:7.1f} req/s: TTFT p50 {row['ttft_ms_p50']:.0f} ms, p90 "
                      f"{row['ttft_ms_p90']:.0f} ms; TPOT p50 {row['tpot_ms_p50']:.1f} ms; "
                      f"{row['output_throughput']:.0f} tok/s", flush=True)
                _write(results, args)  # after every run: a run cut short by a time limit keeps what it measured
    return 0


def _write(results: dict, args: argparse.Namespace) -> None:
    for mode, rows in results["runs"].items():
        met = [r["qps"] for r in rows if r["ttft_ms_p90"] is not None and r["ttft_ms_p90"] <= args.ttft_p90_ms]
        results[f"{mode}_highest_qps_meeting_slo"] = max(met) if met else None
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
