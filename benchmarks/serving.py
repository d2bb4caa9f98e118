"""Serving capacity, before and after: ``python benchmarks/serving.py --before-tree DIR --json OUT``.

The highest request rate at which TTFT p90 stays within ``--ttft-p90-ms`` (1 s), found on the GPU by
bisection: each probe replays the trace with ``engine.replay`` at one QPS (arrivals rescaled) and the
bracket ``[highest rate that met the SLO, lowest rate that missed it]`` narrows geometrically.

Two engines are compared, their probes alternated so that both see the same host:
- with ``--before-tree DIR``: ``before`` is the engine in DIR (a checkout of an older commit, e.g.
  ``git archive d069b6d | tar -x -C DIR``, the tree before issue 16) and ``now`` is this tree;
- without it: ``eager-prefill`` (this engine with prefill and mixed steps run eagerly,
  ``--max-cuda-graph-tokens 0``) and ``piecewise`` (the default).
``--now-args "..."`` adds engine.replay options to the second engine's probes: ``--before-tree .
--now-args=--overlap-decode-attention`` compares this engine's defaults with an option turned on.

The trace is ``--trace PATH`` (its first ``--num-requests`` requests), or by default a prefill-heavy
synthetic one (``traces.synth``: prompts lognormal, median 2,048 tokens, outputs geometric, mean 28;
seed 7). qwen3-0.6b with dummy weights, one GPU. Each engine first replays the trace's first
``--warmup-requests`` at its bracket's upper rate, unmeasured: on a fresh machine Triton compiles each
kernel variant the first time a step needs it (seconds each), which would inflate the first probe.

The figure is a lower bound on the ratio: ``now``'s highest passing rate over ``before``'s lowest failing
rate (``ratio_lower_bound`` in the JSON), written after every probe so that a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402
from traces.files import existing_path  # noqa: E402


def make_trace(path: Path, num_requests: int) -> None:
    subprocess.run([sys.executable, "-m", "traces.synth", "-o", str(path), "--num-requests", str(num_requests),
                    "--qps", "50", "--prompt-dist", "lognormal:median=2048,sigma=0.4,max=8000",
                    "--output-dist", "geometric:mean=28,max=512", "--seed", "7"], cwd=REPO, check=True,
                   capture_output=True)


def replay(tree: Path, trace: Path, qps: float, limit: int, extra: list[str], out: Path, model: str) -> dict:
    started = time.perf_counter()
    # The engine under test is the one in ``tree``: its folder comes first on the import path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "engine.replay", *_probe_args(trace, qps, limit, model, out), *extra],
                   cwd=tree, env=env, check=True)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "qps": round(qps, 3), "wall_s": round(time.perf_counter() - started, 1),
        "ttft_ms_p50": summary["ttft_ms"]["p50"], "ttft_ms_p90": summary["ttft_ms"]["p90"],
        "tpot_ms_p50": summary["tpot_ms"]["p50"], "output_throughput": summary["output_throughput"],
        "num_finished": summary["num_finished"],
    }


def _probe_args(trace: Path, qps: float, limit: int, model: str, out: Path) -> list[str]:
    """engine.replay's arguments for one probe, before --now-args (PROBE_OPTIONS: its options)."""
    return [str(trace), "--qps", f"{qps:.3f}", "--limit", str(limit), "--model", model, "--load-format", "dummy",
            "--max-model-len", "16384", "--out", str(out), "--quiet", "--no-report"]


def cuda_available() -> bool:
    """Whether torch sees a CUDA device, False without torch (a function of its own: the bisection's tests stand a GPU
    in for it; benchmarks/serving_overhead.py asks it too)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _rate_pair(parser: argparse.ArgumentParser, text: str, option: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        parser.exit(2, f"error: {option}: expected LOW,HIGH request rates, got {text!r}\n")
    if not 0 < lo < hi < math.inf:
        parser.exit(2, f"error: {option}: expected 0 < LOW < HIGH, got {text!r}\n")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python benchmarks/serving.py", description=__doc__.splitlines()[0])
    parser.add_argument("--before-tree", default=None, help="folder holding the engine to compare against")
    parser.add_argument("--trace", default=None, help="trace to replay (default: the prefill-heavy synthetic one)")
    parser.add_argument("--before-range", default="30,120", help="LOW,HIGH req/s bracket of the first engine")
    parser.add_argument("--now-range", default="60,180", help="LOW,HIGH req/s bracket of the second engine")
    parser.add_argument("--probes", type=int, default=5, help="bisection probes per engine")
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--ttft-p90-ms", type=float, default=1000.0, help="the SLO (default: %(default)s)")
    parser.add_argument("--warmup-requests", type=int, default=300,
                        help="unmeasured replay of this many requests per engine first (0: none)")
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    parser.add_argument("--now-args", default="", metavar="OPTIONS",
                        help="engine.replay options added to the second engine's probes, as one string "
                             "(--now-args=--overlap-decode-attention)")
    args = parser.parse_args(argv)
    now_args = _engine_args(parser, args.now_args)
    if args.num_requests < 1 or args.warmup_requests < 0 or args.probes < 1:
        parser.exit(2, "error: --num-requests and --probes must be >= 1 and --warmup-requests >= 0\n")
    brackets = [_rate_pair(parser, args.before_range, "--before-range"),
                _rate_pair(parser, args.now_range, "--now-range")]
    # With nan or a limit <= 0 every probe missed the SLO, with inf every one met it: a bisection that found nothing.
    if not 0 < args.ttft_p90_ms < math.inf:
        parser.exit(2, f"error: --ttft-p90-ms must be a finite number of milliseconds > 0, got {args.ttft_p90_ms}\n")
    trace_file = existing_path(args.trace) if args.trace is not None else None  # is_file() raised on a long name
    if args.trace is not None and not (trace_file is not None and trace_file.is_file()):
        parser.exit(2, f"error: --trace: {args.trace} is not a file\n")
    from engine.core.model_config import ModelShape

    try:  # torch-free; engine.replay would refuse it only after the synthetic trace was made
        ModelShape.load(args.model)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: --model {args.model}: {exc}\n")
    # Found before the GPU runs: --json onto the trace replaced it, and a folder failed after the first probe.
    problem = args.json is not None and check_output_path(args.json, "--json",
                                                          [Path(args.trace)] if args.trace else [])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        parser.exit(2, f"error: --json: the folder of {args.json} does not exist\n")
    if args.before_tree is not None:
        before = Path(args.before_tree).resolve()
        if not (before / "engine" / "replay.py").is_file():
            parser.exit(2, f"error: --before-tree: {before} holds no engine/replay.py\n")
        engines = {"before": (before, []), "now": (REPO, now_args)}
    else:
        engines = {"eager-prefill": (REPO, ["--max-cuda-graph-tokens", "0"]), "piecewise": (REPO, now_args)}
    # After the options (each refused on its own first), before the trace is made: without a GPU every engine.replay
    # fell back to the CPU with only a note, each probe ran for hours, and the JSON gave the CPU's rates as capacities.
    if not cuda_available():
        parser.exit(2, "error: this benchmark times engine.replay on a CUDA GPU and found none\n")
    results: dict = {"model": args.model, "trace": args.trace or "synthetic prefill-heavy (seed 7)",
                     "num_requests": args.num_requests, "ttft_p90_ms_limit": args.ttft_p90_ms,
                     "warmup_requests": args.warmup_requests,
                     "engines": {name: str(tree) for name, (tree, _) in engines.items()},
                     "engine_args": {name: extra for name, (_, extra) in engines.items()},
                     "runs": {name: [] for name in engines}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace is None:
            trace = Path(tmp) / "prefill_heavy.parquet"
            make_trace(trace, args.num_requests)
        else:
            trace = Path(args.trace).resolve()
        bounds = {name: list(bracket) for name, bracket in zip(engines, brackets, strict=True)}
        if args.warmup_requests:
            for name, (tree, extra) in engines.items():
                warm = replay(tree, trace, bounds[name][1], args.warmup_requests, extra, Path(tmp) / f"warm-{name}",
                              args.model)
                results.setdefault("warmup_wall_s", {})[name] = warm["wall_s"]
        for probe in range(args.probes):
            for name, (tree, extra) in engines.items():
                lo, hi = bounds[name]
                qps = math.sqrt(lo * hi)
                row = replay(tree, trace, qps, args.num_requests, extra, Path(tmp) / f"{name}-{probe}", args.model)
                row["met_slo"] = row["ttft_ms_p90"] is not None and row["ttft_ms_p90"] <= args.ttft_p90_ms
                bounds[name][0 if row["met_slo"] else 1] = qps
                results["runs"][name].append(row)
                print(f"{name:14s} {qps:7.1f} req/s: TTFT p50 {_ms(row['ttft_ms_p50'])}, p90 "
                      f"{_ms(row['ttft_ms_p90'])} ({'met' if row['met_slo'] else 'missed'}); TPOT p50 "
                      f"{_ms(row['tpot_ms_p50'])}; {row['output_throughput'] or 0:.0f} tok/s", flush=True)
                _write(results, args)
    return 0


# What each probe sets itself: given again in --now-args, the later one would win and the bisection measure another run.
_A_PROBE = _probe_args(Path("trace.parquet"), 1.0, 1, "qwen3-0.6b", Path("out"))  # what one probe passes
PROBE_OPTIONS = tuple(a for a in _A_PROBE if a.startswith("--"))


def _engine_args(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """--now-args as a list, checked by engine.replay's own parser (no torch) before any GPU work."""
    try:
        extra = shlex.split(text)
    except ValueError as exc:
        parser.exit(2, f"error: --now-args: {exc}\n")
    taken = [a for a in extra if a.split("=", 1)[0] in PROBE_OPTIONS]
    if taken:
        parser.exit(2, f"error: --now-args: {taken[0]} is set by every probe; expected other engine.replay options\n")
    from cli.engine_replay import build_parser

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            # Beside the probe's own options, as each probe passes them: an abbreviation of one (--qp 500, which
            # argparse takes for --qps) or an option excluding one (--offline) passed this check alone and failed the
            # first probe, a traceback after the warm-up's GPU minutes.
            build_parser().parse_args([*_A_PROBE, *extra])
    except SystemExit:  # engine.replay's own line names the option
        line = said.getvalue().strip().splitlines()[-1:] or ["not what engine.replay takes"]
        parser.exit(2, f"error: --now-args: {line[0].removeprefix('error: ')}\n")
    return extra


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"  # None: no request finished


def _write(results: dict, args: argparse.Namespace) -> None:
    for name, rows in results["runs"].items():
        met = [r["qps"] for r in rows if r["met_slo"]]
        missed = [r["qps"] for r in rows if not r["met_slo"]]
        results[f"{name}_highest_qps_meeting_slo"] = max(met) if met else None
        results[f"{name}_lowest_qps_missing_slo"] = min(missed) if missed else None
    first, second = results["runs"]
    met_second = results[f"{second}_highest_qps_meeting_slo"]
    missed_first = results[f"{first}_lowest_qps_missing_slo"]
    results["ratio_lower_bound"] = round(met_second / missed_first, 3) if met_second and missed_first else None
    if args.json is not None:
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")  # whole, or the last one kept


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
