"""What the HTTP replay's client (``traces.bench``) costs, so its share of a served run's latencies is known.

A fake OpenAI-compatible server in a subprocess streams one-token chunks ``--itl-ms`` apart; the client replays
a trace slice against it at ``--qps`` and this script reads the client's own CPU time (process time: the
server's is not in it) per streamed chunk and per request, and how late the client sent each request after
its arrival time. Repeated ``--repeats`` times; on a shared machine compare the ratios, not the seconds.

    python benchmarks/bench_client.py traces/sharegpt.parquet --qps 30 --limit 600 --repeats 3
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.config_args import OneLineErrorParser  # noqa: E402

SERVER = r'''
import asyncio, json, sys
from aiohttp import web

ITL_S = float(sys.argv[1])

async def completions(request):
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    n = int(body["max_tokens"])
    for i in range(n):
        if ITL_S:
            await asyncio.sleep(ITL_S)
        chunk = {"id": "c", "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": " tok", "finish_reason": "length" if i == n - 1 else None}]}
        await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
    await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response

async def main():
    app = web.Application(client_max_size=2**26)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
'''


def one_run(url: str, requests, max_concurrency: int | None) -> dict:
    from traces.http_bench import BenchTarget, replay_over_http

    target = BenchTarget(completions_url=f"{url}/v1/completions", model="m", max_concurrency=max_concurrency)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = asyncio.run(replay_over_http(target, requests))
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0]}")
    chunks = sum(len(r.chunk_times_s) for r in results)
    late_ms = np.array([(r.send_s - r.scheduled_s) * 1e3 for r in results])
    return {"requests": len(results), "chunks": chunks, "wall_s": round(wall_s, 3), "client_cpu_s": round(cpu_s, 3),
            "client_cpu_share_of_wall": round(cpu_s / wall_s, 4),
            "client_cpu_us_per_chunk": round(cpu_s / chunks * 1e6, 2),
            "client_cpu_ms_per_request": round(cpu_s / len(results) * 1e3, 3),
            "send_late_ms_p50": round(float(np.percentile(late_ms, 50)), 3),
            "send_late_ms_p99": round(float(np.percentile(late_ms, 99)), 3),
            "send_late_ms_max": round(float(late_ms.max()), 3)}


MAX_ITL_MS = 1000.0  # a served stream's gaps are milliseconds; a second a chunk is already a slow server


def main() -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--qps", type=float, default=30.0)
    parser.add_argument("--limit", type=int, default=600)
    parser.add_argument("--itl-ms", type=float, default=5.0, help="the fake server's gap between chunks")
    parser.add_argument("--max-output-tokens", type=int, default=512, help="cap each request's output")
    parser.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: no cap)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    args = parser.parse_args()

    # --itl-ms is bounded, not only finite: the fake server sleeps that long between chunks, and 1e308 (or any
    # gap of hours) left the benchmark waiting with no end and no word.
    if args.limit < 1 or args.repeats < 1 or args.max_output_tokens < 1 or not 0 <= args.itl_ms <= MAX_ITL_MS:
        parser.exit(2, "error: --limit, --repeats and --max-output-tokens must be >= 1 and --itl-ms a number from 0 "
                       f"to {MAX_ITL_MS:g}\n")
    if not 0 < args.qps < float("inf"):
        parser.exit(2, f"error: --qps must be a finite number > 0, got {args.qps}\n")
    # 0 silently meant no cap at all, and a negative cap was a ValueError traceback from asyncio.Semaphore.
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.exit(2, f"error: --max-concurrency must be >= 1 (or left out: no cap), got {args.max_concurrency}\n")
    from sim.files import check_output_path, write_text_atomic

    # Before the replay: --json onto the trace replaced it, and a folder or an unwritable path failed after the run.
    problem = args.json is not None and check_output_path(args.json, "--json", [Path(args.trace)])
    if problem:
        parser.exit(2, f"error: {problem}\n")

    import polars as pl

    from traces.bench_prompts import bench_requests
    from traces.schema import Trace, load_trace

    try:
        trace = load_trace(args.trace).head(args.limit).with_qps(args.qps)
    except ValueError as exc:  # a TraceError (a ValueError) traceback for a missing or bad trace, or --qps
        parser.exit(2, f"error: {exc}\n")
    capped = trace.requests.with_columns(pl.col("output_tokens").clip(upper_bound=args.max_output_tokens))
    trace = Trace(requests=capped, hash_block_size=trace.hash_block_size, source=trace.source)
    requests = bench_requests(trace, 151_936, 0)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.itl_ms / 1e3)], stdout=subprocess.PIPE,
                              text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        runs = [one_run(url, requests, args.max_concurrency) for _ in range(args.repeats)]
    finally:
        server.terminate()
        server.wait(10)
    result = {"trace": args.trace, "qps": args.qps, "limit": args.limit, "itl_ms": args.itl_ms,
              "max_output_tokens": args.max_output_tokens, "max_concurrency": args.max_concurrency,
              "date": time.strftime("%Y-%m-%d"), "runs": runs}
    print(json.dumps(result, indent=2))
    if args.json is not None:  # whole or not at all, its folder made if missing
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
