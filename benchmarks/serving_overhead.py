"""What the HTTP server adds over the in-process engine, at the same load (GPU).

Runs the same trace slice twice through the same engine configuration: in process
(``python -m engine.replay``) and served (``python -m engine.serve`` driven by ``python -m traces.bench``
over loopback, streaming), and compares their client-visible latencies. The server's own /metrics (TTFT and
ITL measured inside the engine process) are scraped at the end, so the per-request and per-token cost of the
HTTP path is also read directly: client-side minus server-side on the very same requests.

    python benchmarks/serving_overhead.py TRACE --qps 36 --limit 2200 --model qwen3-0.6b \\
        --max-model-len 16384 --out-dir OUT --json benchmarks/results/serving-overhead-h200.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from engine.server.launch import ServerDidNotStart, start_server, stop_server  # noqa: E402

STARTUP_TIMEOUT_S = 600


def last_line(log: Path) -> str:
    """A child's last line of output (its one-line error, "error: " taken off), or "no output"."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    return lines[-1].removeprefix("error: ") if lines else "no output"


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` from the repository root, its output in ``log``; returns its wall time."""
    print("$", " ".join(cmd), flush=True)
    started = time.perf_counter()
    with log.open("w") as out:
        status = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:  # a CalledProcessError traceback, which did not say where the child's own error went
        print(f"error: {cmd[2]} exited with status {status}: {last_line(log)} (its output: {log})", file=sys.stderr)
        sys.exit(2)
    return time.perf_counter() - started


def histogram_means(metrics_text: str) -> dict[str, float]:
    """Mean of each vLLM latency histogram (sum / count) in a Prometheus scrape, in ms."""
    sums, counts = {}, {}
    for line in metrics_text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
        if name.endswith("_seconds_sum"):
            sums[name[: -len("_sum")]] = value
        elif name.endswith("_seconds_count"):
            counts[name[: -len("_count")]] = value
    return {name.removeprefix("vllm:"): 1e3 * sums[name] / counts[name] for name in sums if counts.get(name)}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/serving_overhead.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--qps", type=float, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--out-dir", required=True, help="run folders go here")
    parser.add_argument("--json", required=True, help="the comparison, written here")
    parser.add_argument("--skip-inproc", action="store_true", help="only the served run")
    parser.add_argument("--cpu", action="store_true",
                        help="run the engine on the CPU where torch sees no CUDA GPU (slow; for tests)")
    parser.add_argument("--engine-args", nargs=argparse.REMAINDER, default=["--load-format", "dummy"],
                        help="further engine options for both runs, last (default: --load-format dummy)")
    args = parser.parse_args(argv)
    from sim.files import check_output_path, existing_parent, write_text_atomic
    from traces.files import existing_path, long_name_problem
    from traces.schema import load_trace

    # Here, not in the child replay or bench (their failure was a CalledProcessError traceback), and before the runs:
    # --json onto the trace replaced it after them, and a folder was a traceback there.
    if not 0 < args.qps < float("inf") or args.limit < 1:
        parser.exit(2, f"error: --qps must be a finite number > 0 and --limit >= 1, got {args.qps:g} and "
                       f"{args.limit}\n")
    problem = check_output_path(args.json, "--json", [Path(args.trace)])
    problem = problem or long_name_problem(args.out_dir, "--out-dir")  # Path.exists() below raised on it
    blocked = None if problem else existing_path(args.out_dir) or existing_parent(Path(args.out_dir))
    if not problem and blocked is not None and not blocked.is_dir():
        problem = f"--out-dir {args.out_dir}: {blocked} is a file; expected a folder"
    if problem:
        parser.exit(2, f"error: {problem}\n")
    try:
        load_trace(args.trace)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    # Without a GPU both runs fell back to the CPU with only a note in their logs and ran for hours.
    from benchmarks.serving import cuda_available

    if not args.cpu and not cuda_available():
        parser.exit(2, "error: this benchmark times engine.replay and engine.serve on a CUDA GPU and found none; "
                       "pass --cpu to run them on the CPU anyway (slowly)\n")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    engine_args = ["--model", args.model, "--max-model-len", str(args.max_model_len), *args.engine_args]
    trace_args = [args.trace, "--qps", str(args.qps), "--limit", str(args.limit)]
    commands = {}
    if not args.skip_inproc:
        commands["inproc"] = [py, "-m", "engine.replay", *trace_args, *engine_args, "--out", str(out / "inproc"),
                              "--overwrite", "--quiet", "--no-report"]
        run(commands["inproc"], out / "inproc.log")
    try:
        server, url = start_server(engine_args, cwd=ROOT, log=out / "serve.log", timeout_s=STARTUP_TIMEOUT_S)
    except ServerDidNotStart:  # exit 1 without "error:", where a failed child run says why in one line
        log = out / "serve.log"
        print(f"error: engine.serve did not start: {last_line(log)} (its output: {log})", file=sys.stderr)
        return 2
    commands["serve"] = [str(a) for a in server.args]  # the argv start_server really ran
    print("$", " ".join(commands["serve"]), flush=True)
    try:
        commands["bench"] = [py, "-m", "traces.bench", url, *trace_args, "--out", str(out / "served"),
                             "--overwrite", "--quiet", "--no-report"]
        run(commands["bench"], out / "bench.log")
        metrics_text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
        (out / "served-metrics.txt").write_text(metrics_text)
    finally:
        stop_server(server)
    runs = {name: json.loads((out / name / "summary.json").read_text())
            for name in ("inproc", "served") if (out / name / "summary.json").exists()}
    server_side = histogram_means(metrics_text)
    result = {"trace": args.trace, "qps": args.qps, "limit": args.limit, "model": args.model,
              "commands": {k: " ".join(v) for k, v in commands.items()},
              "server_side_mean_ms": server_side}
    for name, summary in runs.items():
        result[name] = {key: summary.get(key) for key in (
            "num_finished", "duration_s", "request_throughput", "output_throughput", "ttft_ms", "tpot_ms", "itl_ms",
            "e2e_ms", "num_failed")}
    served = runs.get("served")
    if served is not None:
        # The HTTP path measured on the same requests: what the client saw minus what the engine process saw.
        result["http_overhead_same_requests_ms"] = {
            "ttft_mean": served["ttft_ms"]["mean"] - server_side.get("time_to_first_token_seconds", float("nan")),
            "itl_mean": served["itl_ms"]["mean"] - server_side.get("inter_token_latency_seconds", float("nan")),
            "e2e_mean": served["e2e_ms"]["mean"] - server_side.get("e2e_request_latency_seconds", float("nan")),
        }
    if "inproc" in runs and served is not None:
        inproc = runs["inproc"]
        result["served_vs_inproc"] = {
            "ttft_p50_ms_diff": served["ttft_ms"]["p50"] - inproc["ttft_ms"]["p50"],
            "ttft_mean_ms_diff": served["ttft_ms"]["mean"] - inproc["ttft_ms"]["mean"],
            "tpot_p50_ratio": served["tpot_ms"]["p50"] / inproc["tpot_ms"]["p50"],
            "itl_p50_ratio": served["itl_ms"]["p50"] / inproc["itl_ms"]["p50"],
            "e2e_p50_ratio": served["e2e_ms"]["p50"] / inproc["e2e_ms"]["p50"],
            "targets": {"tpot_p50_overhead_max": 0.05, "ttft_p50_overhead_max_ms": 10.0},
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(args.json), json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("served_vs_inproc", "http_overhead_same_requests_ms") if k in result},
                     indent=2))
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
