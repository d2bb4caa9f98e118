"""Serving ceiling: ``python benchmarks/serving_ceiling.py [--gpu h200] [--json OUT]``.

How many requests a second could any engine serve within the TTFT limit of ``benchmarks/serving.py`` (p90 <= 1 s)
on its prefill-heavy synthetic trace (prompts lognormal, median 2,048 tokens; outputs geometric, mean 28; seed 7; the
same table as its ``traces.synth`` call) or the trace ``--trace`` names, if its kernels ran at stated rates and its
host cost nothing? Each figure is the simulator's capacity (the shared
scheduler, chunked prefill at 8,192 tokens a step, the same bisection rule as serving.py: the highest probed rate
whose replay meets the limit) under one cost model:

- ``profile``: the shipped measured profile of the GPU (``--cost-model auto``): the simulator's prediction for the
  engine as it is, to set beside serving.py's GPU measurement;
- ``kernels-in-sequence``: the roofline model (``sim.cost_model.RooflineCostModel``) with every matmul at
  ``--matmul-tflops``, prefill attention at ``--attention-tflops`` (issue 16's target for our kernel, 450, by
  default), weights and KV read at ``--bandwidth-tbs``, and no host time, no per-layer launch floor and no norm,
  rotary, SwiGLU or KV-store traffic at all: kernels that run one after another, as in this engine (and vLLM's and
  SGLang's);
- ``compute-memory-overlapped``: the same rates with each step's FLOP time and byte time overlapped perfectly (a
  step costs the larger of the two): a bound no engine of these kernel rates can pass.

Both idealised models leave out work the engine must do, so their capacities are upper bounds on what kernel and
host work could reach, not predictions. ``--before-qps`` (88.61 req/s, the engine before issue 16 on an H200,
``serving-h200-qwen3-0.6b-prefill-heavy-before-after.json``) turns each into the largest "now over before" ratio it
allows. Torch-free; runs anywhere in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.core.config_args import OneLineErrorParser  # noqa: E402
from sim.files import check_output_path, write_text_atomic  # noqa: E402

# benchmarks/serving.py's trace: its make_trace, without a subprocess
SYNTH_ARGS = {"prompt_dist": "lognormal:median=2048,sigma=0.4,max=8000", "output_dist": "geometric:mean=28,max=512",
              "qps": 50.0, "seed": 7}
MAX_MODEL_LEN = 16384  # serving.py's engine.replay option
# The engine before issue 16, measured on an H200 (2026-12-02): the highest rate that met TTFT p90 <= 1 s
BEFORE_QPS_H200 = 88.61
MAX_NUM_REQUESTS = 100_000  # the most requests a bisection replays at each rate (a few seconds a replay)


def make_trace(num_requests: int):
    from traces.synth import SynthConfig, synthesize

    return synthesize(SynthConfig(num_requests=num_requests, **SYNTH_ARGS))


def load_probe_trace(path: Path | None, num_requests: int):
    """What each probe replays: serving.py's synthetic trace (``path`` None) or the first ``num_requests`` of the
    trace at ``path``. Raises TraceError where that cannot be read, and ValueError where those requests all arrive at
    once: a probe rescales their gaps to its rate and there are none (a with_qps traceback at the first probe)."""
    from traces.schema import load_trace

    trace = make_trace(num_requests) if path is None else load_trace(path).head(num_requests)
    try:
        trace.with_qps(1.0)  # the rescaling every probe does, tried once before any runs
    except ValueError:
        raise ValueError(f"its first {len(trace)} request(s) all arrive at once; expected arrival times spread in "
                         "time, whose gaps each probe rescales to its rate") from None
    return trace


def replay(trace, config, cost_model) -> tuple[float, float, float]:
    """TTFT p90 (ms) of one replay, the device time its steps took per request (ms), and the fraction of the replay's
    span they kept the device busy."""
    import polars as pl

    from analysis.metrics import summarize
    from sim.simulator import simulate

    result = simulate(trace, config, cost_model=cost_model)
    requests = pl.from_arrow(result.requests_table())
    p90 = summarize(requests, None, vllm_names=False)["ttft_ms"]["p90"]
    steps = pl.from_arrow(result.steps_table())
    busy_s = float(steps["duration_s"].sum())
    span_s = float((steps["start_s"] + steps["duration_s"]).max() - requests["arrival_s"].min())
    return math.inf if p90 is None else p90, 1e3 * busy_s / len(requests), busy_s / span_s


def capacity(trace, config, cost_model, limit_ms: float, lo: float, hi: float, rel_precision: float) -> dict:
    """Bisection as serving.py's (geometric midpoints), run until the bracket is ``rel_precision`` wide: the highest
    rate that met the limit and the lowest that missed it. The bracket is widened first if an end is not one."""
    probes = []
    best: dict = {}  # the probe at the highest rate that met the limit

    def meets(qps: float) -> bool:
        p90, busy_ms, busy_fraction = replay(trace.with_qps(qps), config, cost_model)
        probes.append({"qps": round(qps, 3), "ttft_ms_p90": round(p90, 1) if math.isfinite(p90) else None,
                       "busy_ms_per_request": round(busy_ms, 3), "busy_fraction": round(busy_fraction, 4)})
        if p90 <= limit_ms and qps >= best.get("rate", 0.0):
            best.update(probes[-1], rate=qps)
        return p90 <= limit_ms

    while not meets(lo):
        lo /= 2
        if lo < 1e-3:  # a request alone takes longer than the limit
            return {"met_qps": None, "missed_qps": lo * 2, "probes": probes,
                    "note": f"the limit was missed even at {lo * 2:.3g} req/s: one request alone takes longer"}
    while meets(hi):
        lo, hi = hi, hi * 2
        if hi > 1e6:  # every request at once still met the limit: too few requests for it to bind
            return {"met_qps": None, "missed_qps": None, "probes": probes,
                    "note": "the limit held with every request arriving at once: give more --num-requests"}
    while hi / lo > 1 + rel_precision:
        qps = math.sqrt(lo * hi)
        if meets(qps):
            lo = qps
        else:
            hi = qps
    # At the highest rate that met the limit: the device time a request cost, and the sustained rate that time allows
    # with the device busy all the time (a finite trace's backlog at its end lets a bisection pass that rate)
    return {"met_qps": round(lo, 2), "missed_qps": round(hi, 2), "busy_ms_per_request": best["busy_ms_per_request"],
            "busy_fraction": best["busy_fraction"], "sustained_qps_bound": round(1e3 / best["busy_ms_per_request"], 1),
            "probes": probes}


def full_steps(trace, config, measured, ideal, min_tokens: int) -> dict:
    """The replay's mixed steps of at least ``min_tokens`` batched tokens under the measured model (its ``trace`` at
    the rate that met the limit), each priced again by ``ideal``: what such a step holds, and where the time goes."""
    from types import SimpleNamespace

    import polars as pl

    from sim.simulator import simulate

    steps = pl.from_arrow(simulate(trace, config, cost_model=measured).steps_table()).filter(
        (pl.col("num_batched_tokens") >= min_tokens) & (pl.col("num_prefill_seqs") > 0)
        & (pl.col("num_decode_seqs") > 0))
    if not steps.height:
        return {"num_steps": 0}
    # (mixed steps: none repeats the batch before it)
    ideal_s = [ideal.step_time_s(SimpleNamespace(**row, seqs=[None] * row["num_seqs"], continues_batch=0))
               for row in steps.select(
        "num_prefill_tokens", "num_prefill_seqs", "num_decode_seqs", "prefill_context_tokens",
        "prefill_attention_pairs", "decode_context_tokens", "num_seqs").to_dicts()]
    return {"num_steps": steps.height, "min_batched_tokens": min_tokens,
            "mean_measured_ms": round(1e3 * float(steps["duration_s"].mean()), 2),
            "mean_ideal_ms": round(1e3 * sum(ideal_s) / len(ideal_s), 2),
            "mean_prefill_seqs": round(float(steps["num_prefill_seqs"].mean()), 2),
            "mean_prefill_context_tokens": round(float(steps["prefill_context_tokens"].mean()), 1),
            "mean_decode_seqs": round(float(steps["num_decode_seqs"].mean()), 1),
            "mean_decode_context_tokens": round(float((steps["decode_context_tokens"]
                                                       / steps["num_decode_seqs"]).mean()), 1)}


def idealised(model_shape, gpu, matmul_tflops: float, attention_tflops: float, bandwidth_tbs: float, overlap: bool):
    from sim.cost_model import RooflineConstants, RooflineCostModel

    # Efficiencies are fractions of the spec's rates: those that turn them into the rates asked for
    constants = RooflineConstants(
        matmul_efficiency=matmul_tflops * 1e12 / gpu.bf16_flops,
        weight_bandwidth_efficiency=bandwidth_tbs * 1e12 / gpu.bandwidth_bps,
        kv_bandwidth_efficiency=bandwidth_tbs * 1e12 / gpu.bandwidth_bps,
        attention_flops_efficiency=attention_tflops * 1e12 / gpu.bf16_flops,
        step_overhead_s=0.0, continuing_step_overhead_s=0.0, per_seq_overhead_s=0.0, per_layer_overhead_s=0.0,
        overlap_compute_and_memory=overlap)
    return RooflineCostModel(model_shape, gpu, constants=constants)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 10 to {MAX_NUM_REQUESTS}, got {text!r}") from None
    if not 10 <= value <= MAX_NUM_REQUESTS:
        raise argparse.ArgumentTypeError(f"expected an integer from 10 to {MAX_NUM_REQUESTS}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    from sim.hardware import GPUS

    parser = OneLineErrorParser(prog="python benchmarks/serving_ceiling.py", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200", choices=sorted(GPUS), help="GPU whose rates and profile are used")
    parser.add_argument("--model", default="qwen3-0.6b", help="shipped model config (default: %(default)s)")
    parser.add_argument("--trace", default=None,
                        help="trace parquet to replay, as serving.py --trace (default: its synthetic prefill-heavy)")
    parser.add_argument("--num-requests", type=_count, default=1500,
                        help="serving.py's default (1,500): the trace's first N requests")
    parser.add_argument("--ttft-p90-ms", type=_positive, default=1000.0, help="the SLO (default: %(default)s)")
    parser.add_argument("--matmul-tflops", type=_positive, default=None,
                        help="matmul rate (default: the GPU's measured rate in sim.hardware, else 80%% of its "
                             "datasheet's)")
    parser.add_argument("--attention-tflops", type=_positive, default=None,
                        help="prefill attention rate (default: issue 16's target, 450, or the matmul rate if lower)")
    parser.add_argument("--bandwidth-tbs", type=_positive, default=None,
                        help="HBM rate for weights and KV (default: the GPU's measured copy rate, else 90%% of its "
                             "datasheet's)")
    parser.add_argument("--before-qps", type=_positive, default=BEFORE_QPS_H200,
                        help="the engine before's capacity, to turn ceilings into ratios (default: %(default)s, H200)")
    parser.add_argument("--json", default=None, metavar="OUT", help="also write the figures here")
    args = parser.parse_args(argv)
    # The trace is an input: --json onto it replaced it with the figures.
    problem = args.json is not None and check_output_path(args.json, "--json",
                                                          [Path(args.trace)] if args.trace else [])
    if problem:
        parser.exit(2, f"error: {problem}\n")
    if args.json is not None and not Path(args.json).resolve().parent.is_dir():
        parser.exit(2, f"error: --json: the folder of {args.json} does not exist\n")

    from sim.config import SimConfig
    from sim.simulator import make_cost_model

    gpu = GPUS[args.gpu]
    try:
        config = SimConfig(model=args.model, gpu=args.gpu, max_model_len=MAX_MODEL_LEN)
        model_shape = config.model_shape
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: --model {args.model}: {exc}\n")
    matmul_tflops = args.matmul_tflops or (gpu.measured_bf16_flops or 0.8 * gpu.datasheet_bf16_flops) / 1e12
    attention_tflops = args.attention_tflops or min(450.0, matmul_tflops)
    bandwidth_tbs = args.bandwidth_tbs or (gpu.measured_bandwidth_bps or 0.9 * gpu.datasheet_bandwidth_bps) / 1e12
    models = {}
    measured = make_cost_model(config, model_shape)  # the default roofline estimate where no profile was measured
    if measured.name == "roofline-estimate":
        print(f"note: no measured profile of {args.model} on {args.gpu}: the ceilings alone", file=sys.stderr)
    else:
        models["profile"] = measured
    models["kernels-in-sequence"] = idealised(model_shape, gpu, matmul_tflops, attention_tflops, bandwidth_tbs,
                                              overlap=False)
    models["compute-memory-overlapped"] = idealised(model_shape, gpu, matmul_tflops, attention_tflops,
                                                    bandwidth_tbs, overlap=True)
    from traces.schema import TraceError

    trace_path = None if args.trace is None else Path(args.trace)
    trace_name = args.trace if trace_path is not None else f"serving.py's synthetic prefill-heavy, {SYNTH_ARGS}"
    try:
        trace = load_probe_trace(trace_path, args.num_requests)
    except (OSError, TraceError, ValueError) as exc:
        parser.exit(2, f"error: --trace {trace_name}: {exc}\n")
    results = {"gpu": args.gpu, "model": args.model, "trace": trace_name,
               "num_requests": args.num_requests, "ttft_p90_ms_limit": args.ttft_p90_ms,
               "matmul_tflops": round(matmul_tflops, 1), "attention_tflops": round(attention_tflops, 1),
               "bandwidth_tbs": round(bandwidth_tbs, 3), "before_qps": args.before_qps,
               "issue_target_ratio": 1.6, "models": {}}
    started = time.process_time()
    for name, cost_model in models.items():
        try:
            found = capacity(trace, config, cost_model, args.ttft_p90_ms, 60.0, 240.0, rel_precision=0.005)
        except ValueError as exc:  # the tables' own checks (times past 1e12 s): a ValueError traceback at exit 1
            parser.exit(2, f"error: the {name} replays cannot be summarized: {exc} (their steps are priced beyond any "
                           "GPU: check --model, --matmul-tflops, --attention-tflops and --bandwidth-tbs)\n")
        found["cost_model"] = getattr(cost_model, "name", name)
        results["models"][name] = found
        if found["met_qps"] is None:
            print(f"{name:26s} {found['note']}", flush=True)
            continue
        found["ratio_to_before"] = ratio = round(found["met_qps"] / args.before_qps, 3)
        print(f"{name:26s} highest rate meeting TTFT p90 <= {args.ttft_p90_ms:g} ms: {found['met_qps']} req/s "
              f"(missed at {found['missed_qps']}); {ratio:.2f}x the engine before's "
              f"{args.before_qps:g}; device {found.get('busy_ms_per_request')} ms a request, busy "
              f"{found.get('busy_fraction')} of the replay (sustained at most "
              f"{found.get('sustained_qps_bound')} req/s)", flush=True)
    if "profile" in models and results["models"]["profile"]["met_qps"] is not None:  # (None: no rate found)
        # Where the measured model's time goes beyond the kernels': its full mixed steps at the rate that met the limit
        gap = full_steps(trace.with_qps(results["models"]["profile"]["met_qps"]), config, models["profile"],
                         models["kernels-in-sequence"], int(0.95 * config.max_num_batched_tokens))
        results["full_mixed_steps_at_profile_capacity"] = gap
        if gap["num_steps"]:
            print(f"full mixed steps at the profile's capacity ({gap['num_steps']}, >= {gap['min_batched_tokens']} "
                  f"tokens): {gap['mean_prefill_seqs']} prefill chunks after {gap['mean_prefill_context_tokens']} "
                  f"cached tokens, {gap['mean_decode_seqs']} decode rows at {gap['mean_decode_context_tokens']}-token "
                  f"contexts: {gap['mean_measured_ms']} ms measured, {gap['mean_ideal_ms']} ms kernels in sequence")
    results["cpu_s"] = round(time.process_time() - started, 2)
    results["python"] = platform.python_version()
    if args.json is not None:
        write_text_atomic(Path(args.json), json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    from engine.core.interrupt import one_line_script_errors

    sys.exit(one_line_script_errors(main)())
