"""The simulator against benchmarks/serving.py's GPU probes: ``python validation/serving_probes.py RESULTS --gpu h100``.

serving.py bisects the highest request rate at which an engine keeps TTFT p90 within 1 s, each probe an
``engine.replay`` of the trace's first requests at one rate: runs at 80-110 % of capacity, the knee of the latency
curve, where a simulator's small errors in step time become large errors in queueing. For every probe of one engine
(``--engine``, default ``now``: the engine of this tree; the older engine has no profile of its own), this script
replays the same requests at the same rate in the simulator (the GPU's measured profile, ``--cost-model auto``) and
prints sim and GPU side by side: TTFT p50 and p90, TPOT p50, output throughput, and whether each met the limit. Then
the simulator's own bisection (benchmarks/serving_ceiling.py's rule, to 0.5 %) beside the GPU's bracket.

The trace is the one serving.py replayed: its synthetic prefill-heavy one where the results say so (made again, the
same seed), else the results' ``trace`` path or ``--trace``. Torch-free.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402


def _pct(sim: float | None, real: float | None) -> str:
    if sim is None or real is None or not real:
        return "n/a"
    return f"{100.0 * (sim - real) / real:+.1f} %"


def _num(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rate(qps: float | None, absent: str) -> str:
    """A bracket's rate in the summary line, or what its absence means: Python's "None" read as a rate."""
    return absent if qps is None else f"{qps}"


FIGURES = ("ttft_ms_p50", "ttft_ms_p90", "tpot_ms_p50", "output_throughput")  # each probe's, as serving.py writes


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _probe_problem(probe) -> str | None:
    """What is wrong with one of serving.py's probes, or None: a rate, figures that are numbers or null (what
    serving.py left empty) and a verdict (a string figure failed as a format-code traceback; "no" counted as met)."""
    qps = probe.get("qps") if isinstance(probe, dict) else None
    if not (_is_number(qps) and 0 < qps < 1e9):
        return f"expected a probe with a rate 'qps' > 0 (as serving.py writes), got {probe!r:.80}"
    bad = next((key for key in FIGURES if probe.get(key) is not None
                and not (_is_number(probe[key]) and math.isfinite(probe[key]))), None)
    if bad:
        return f"'{bad}' is {probe[bad]!r:.40}; expected a finite number or null"
    if not isinstance(probe.get("met_slo"), bool):
        return f"'met_slo' is {probe.get('met_slo')!r:.40}; expected true or false"
    return None


def _settings_problem(results: dict, max_requests: int) -> str | None:
    """What is wrong with the run's settings, or None (each was a ValueError or TypeError traceback)."""
    num_requests = results["num_requests"]
    if not (isinstance(num_requests, int) and not isinstance(num_requests, bool) and 1 <= num_requests <= max_requests):
        return f"'num_requests' is {num_requests!r:.40}; expected an integer from 1 to {max_requests}"
    limit_ms = results["ttft_p90_ms_limit"]
    if not (_is_number(limit_ms) and 0 < limit_ms < math.inf):
        return f"'ttft_p90_ms_limit' is {limit_ms!r:.40}; expected a finite number of milliseconds > 0"
    if not isinstance(results["trace"], str):
        return f"'trace' is {results['trace']!r:.40}; expected the path serving.py replayed"
    if not isinstance(results["model"], str) or not results["model"]:
        return f"'model' is {results['model']!r:.40}; expected the model serving.py's probes ran (its --model)"
    engine_args = results.get("engine_args", {})
    if not isinstance(engine_args, dict) or not all(
            isinstance(extra, list) and all(isinstance(a, str) for a in extra) for extra in engine_args.values()):
        return (f"'engine_args' is {engine_args!r:.40}; expected each engine's extra engine.replay options, lists of "
                "strings")
    return None


def _load_results(parser, path: str, max_requests: int) -> dict:
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.exit(2, f"error: {path}: cannot read serving.py's results: {exc}\n")
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict):
        parser.exit(2, f"error: {path}: expected benchmarks/serving.py's JSON (an object with 'runs')\n")
    for key, default in (("num_requests", 1500), ("ttft_p90_ms_limit", 1000.0), ("trace", ""),
                         ("model", "qwen3-0.6b")):  # serving.py's defaults
        results.setdefault(key, default)
    problem = _settings_problem(results, max_requests)
    if problem:
        parser.exit(2, f"error: {path}: {problem}\n")
    for engine, probes in results["runs"].items():
        for i, probe in enumerate(probes if isinstance(probes, list) else [None]):
            problem = _probe_problem(probe)
            if problem:
                parser.exit(2, f"error: {path}: runs.{engine}[{i}]: {problem}\n")
    return results


def _trace_path(trace_name: str) -> Path:
    path = Path(trace_name)
    if not path.is_absolute() and not path.exists():  # serving.py ran in the repository's root
        path = ROOT / path
    return path


def main(argv: list[str] | None = None) -> int:
    import serving_ceiling

    from sim.hardware import GPUS

    parser = OneLineErrorParser(prog="python validation/serving_probes.py", description=__doc__.splitlines()[0])
    parser.add_argument("results", help="benchmarks/serving.py's --json output")
    parser.add_argument("--gpu", required=True, choices=sorted(GPUS), help="the GPU the probes ran on")
    parser.add_argument("--engine", default="now", help="which engine's probes (default: %(default)s)")
    parser.add_argument("--trace", default=None, help="the trace serving.py replayed (default: as its results say)")
    parser.add_argument("--bands", type=int, default=0, metavar="N",
                        help="also N seeded band replays per probe (sim.bands: host speed and step residuals varied): "
                             "each figure's p5-p95 band and whether the GPU's lies inside (0: none; 2 to 200)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the table here")
    args = parser.parse_args(argv)
    if args.bands and not 2 <= args.bands <= 200:
        parser.exit(2, f"error: --bands must be 0 or an integer from 2 to 200, got {args.bands}\n")
    results = _load_results(parser, args.results, serving_ceiling.MAX_NUM_REQUESTS)
    probes = results["runs"].get(args.engine)
    if not probes:
        parser.exit(2, f"error: --engine {args.engine}: {args.results} holds probes of "
                       f"{', '.join(sorted(results['runs'])) or 'no engine'}\n")
    num_requests, limit_ms = results["num_requests"], float(results["ttft_p90_ms_limit"])
    trace_name = args.trace if args.trace is not None else results["trace"]
    synthetic = args.trace is None and trace_name.startswith("synthetic")
    trace_path = None if synthetic else _trace_path(trace_name)
    # The trace is an input too: --json onto it replaced it with the table.
    inputs = [Path(args.results)] + ([trace_path] if trace_path is not None else [])
    problem = args.json is not None and check_output_path(args.json, "--json", inputs)
    if problem:
        parser.exit(2, f"error: {problem}\n")

    import numpy as np
    import polars as pl

    from analysis.metrics import summarize
    from sim.config import SimConfig
    from sim.simulator import make_cost_model, simulate
    from traces.schema import TraceError

    try:
        trace = serving_ceiling.load_probe_trace(trace_path, num_requests)
    except (OSError, TraceError, ValueError) as exc:
        parser.exit(2, f"error: --trace {trace_name}: {exc}\n")
    # The model the probes ran: results of serving.py --model qwen3-8b were simulated on qwen3-0.6b's profile, every
    # figure and verdict another model's, at exit 0.
    try:
        config = SimConfig(model=results["model"], gpu=args.gpu, max_model_len=serving_ceiling.MAX_MODEL_LEN)
        model_shape = config.model_shape
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: {args.results}: 'model' {results['model']!r:.60}: {exc}\n")
    cost_model = make_cost_model(config, model_shape)
    def figures(rate_trace, run_config, run_cost_model) -> dict:
        result = simulate(rate_trace, run_config, cost_model=run_cost_model)
        summary = summarize(pl.from_arrow(result.requests_table()), None, vllm_names=False)
        return {"ttft_ms_p50": summary["ttft_ms"]["p50"], "ttft_ms_p90": summary["ttft_ms"]["p90"],
                "tpot_ms_p50": summary["tpot_ms"]["p50"], "output_throughput": summary["output_throughput"]}

    rows = []
    for probe in sorted(probes, key=lambda p: p["qps"]):
        rate_trace = trace.with_qps(probe["qps"])
        sim = figures(rate_trace, config, cost_model)
        sim["met_slo"] = sim["ttft_ms_p90"] is not None and sim["ttft_ms_p90"] <= limit_ms
        row = {"qps": probe["qps"], "gpu": {k: probe.get(k) for k in (*sim, "met_slo")}, "sim": sim}
        if args.bands:
            from sim.bands import band_replay

            replays = [figures(rate_trace, *band_replay(config, i)) for i in range(args.bands)]
            row["bands"] = {}
            for key in ("ttft_ms_p50", "ttft_ms_p90", "tpot_ms_p50", "output_throughput"):
                values = np.array([r[key] for r in replays if r[key] is not None], dtype=float)
                low, high = (float(v) for v in np.percentile(values, [5, 95]))
                real = probe.get(key)
                row["bands"][key] = {"p5": round(low, 3), "p95": round(high, 3),
                                     "gpu_inside": real is not None and low <= real <= high}
        rows.append(row)
    found = serving_ceiling.capacity(trace, config, cost_model, limit_ms, 0.5 * rows[0]["qps"], rows[-1]["qps"],
                                     rel_precision=0.005)
    met = [r["qps"] for r in rows if r["gpu"]["met_slo"]]
    missed = [r["qps"] for r in rows if not r["gpu"]["met_slo"]]
    table = {"results": args.results, "gpu": args.gpu, "model": results["model"], "engine": args.engine,
             "cost_model": cost_model.name,
             "trace": str(trace_name), "num_requests": num_requests, "ttft_p90_ms_limit": limit_ms, "probes": rows,
             "gpu_met_qps": max(met) if met else None, "gpu_missed_qps": min(missed) if missed else None,
             "sim_met_qps": found["met_qps"], "sim_missed_qps": found["missed_qps"],
             "verdicts_agree": sum(r["gpu"]["met_slo"] == r["sim"]["met_slo"] for r in rows),
             "num_band_replays": args.bands, "sim_note": found.get("note")}
    if args.bands:
        table["figures_inside_bands"] = sum(b["gpu_inside"] for r in rows for b in r["bands"].values())
        table["figures_banded"] = sum(len(r["bands"]) for r in rows)
    print(f"{args.engine} engine's probes of {results['model']} on the {args.gpu} ({trace_name}, first "
          f"{num_requests} requests); simulated with {cost_model.name}")
    engine_args = results.get("engine_args", {}).get(args.engine, [])
    if engine_args:  # --now-args (--overlap-decode-attention), or the eager-prefill engine's: SimConfig has none
        print(f"note: the {args.engine} engine ran engine.replay with {' '.join(engine_args)}, which this "
              "simulation does not replay: its figures are those of the profile's engine")
    table["engine_args"] = engine_args
    print("| req/s | TTFT p50 GPU / sim | TTFT p90 GPU / sim | TPOT p50 GPU / sim | output tok/s GPU / sim "
          "| met (GPU/sim) |")
    print("|--:|--:|--:|--:|--:|:--|")
    for r in rows:
        cells = [f"{r['qps']:.1f}"]
        for key, digits in (("ttft_ms_p50", 0), ("ttft_ms_p90", 0), ("tpot_ms_p50", 1), ("output_throughput", 0)):
            real, sim = r["gpu"][key], r["sim"][key]
            cells.append(f"{_num(real, digits)} / {_num(sim, digits)} ({_pct(sim, real)})")
        cells.append(f"{'yes' if r['gpu']['met_slo'] else 'no'} / {'yes' if r['sim']['met_slo'] else 'no'}")
        if "bands" in r:  # the GPU's figure inside the replays' p5-p95 band: + ; outside: -
            cells[1:5] = [f"{cell} {'+' if r['bands'][key]['gpu_inside'] else '-'}" for cell, key in zip(
                cells[1:5], ("ttft_ms_p50", "ttft_ms_p90", "tpot_ms_p50", "output_throughput"), strict=True)]
        print("| " + " | ".join(cells) + " |")
    gpu_bracket = (f"met {_rate(table['gpu_met_qps'], 'at no probe')}, "
                   f"missed {_rate(table['gpu_missed_qps'], 'at no probe')}")
    print(f"capacity (TTFT p90 <= {limit_ms:g} ms): GPU {gpu_bracket}; simulator met "
          f"{_rate(found['met_qps'], 'at no rate tried')}, missed {_rate(found['missed_qps'], 'at no rate tried')}; "
          f"verdicts agree on {table['verdicts_agree']} of {len(rows)} probes"
          + (f" ({found['note']})" if found.get("note") else "")
          + (f"; GPU figures inside the {args.bands} replays' p5-p95 bands (+): {table['figures_inside_bands']} of "
             f"{table['figures_banded']}" if args.bands else ""))
    if args.json is not None:
        write_text_atomic(Path(args.json), json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
