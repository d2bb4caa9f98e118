"""How far the roofline estimate is from the measured profiles, and the constants that bring it closest.

The roofline (``sim.cost_model.RooflineCostModel``) prices every model/GPU pair without a measured profile
(llama-3.1-8b on any GPU, anything on an A100 or L40S). Its efficiencies were leads from other engines' kernels. This
script prices a set of batches with the roofline and with each shipped profile: a grid a serving engine forms (decode
batches of 1-256 rows at 128-8k contexts, repeating the batch before them or not, prefill chunks of 256-8k tokens after
0-8k cached ones, mixed steps of 8,192 tokens) and steps sampled from ShareGPT replays simulated under the H200
profiles (contexts that differ within a batch, several prefill chunks beside decode rows). It fits the roofline's eight
constants (least squares on log(roofline / profile), by coordinate descent in log space from the leads: the roofline
itself is what is evaluated, so nothing of its formula is copied here) to each GPU's two profiles (the constants
RooflineCostModel uses on that GPU) and to all four (those of any other GPU).

It also says how well fitted constants carry to what they were not fitted on (one GPU's fit priced on the other GPU,
one model's on the other model), replays traces/sharegpt.parquet at 20 req/s on the H200 under each profile and under
the roofline with the leads and with the shipped constants (how the steps' errors add up in TTFT and TPOT), and, with
``--real``, simulates GPU runs of a model no profile was measured for and compares their headline latencies.

    python validation/roofline_fit.py [--json validation/results/roofline-fit.json] [--real RUN ... --gpu h100]
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # (run as a script from anywhere)
    sys.path.insert(0, str(ROOT))

from engine.core.interrupt import one_line_script_errors  # noqa: E402
from engine.core.sampling_params import SamplingParams  # noqa: E402
from engine.core.scheduler import ScheduledBatch  # noqa: E402
from engine.core.sequence import Sequence  # noqa: E402
from sim.config import SimConfig  # noqa: E402
from sim.cost_model import RooflineConstants, RooflineCostModel, roofline_constants_for  # noqa: E402
from sim.files import repeated_input_problem, write_text_atomic  # noqa: E402
from sim.hardware import get_gpu  # noqa: E402
from sim.simulator import make_cost_model  # noqa: E402
from traces.schema import Trace  # noqa: E402

PAIRS = [("h200", "qwen3-0.6b"), ("h200", "qwen3-8b"), ("h100", "qwen3-0.6b"), ("h100", "qwen3-8b")]
FITTED = ("step_overhead_s", "continuing_step_overhead_s", "per_layer_overhead_s", "per_seq_overhead_s",
          "weight_bandwidth_efficiency", "kv_bandwidth_efficiency", "matmul_efficiency", "attention_flops_efficiency")
BOUNDS = {"step_overhead_s": (1e-5, 5e-3), "continuing_step_overhead_s": (1e-5, 5e-3),
          "per_layer_overhead_s": (1e-7, 2e-4), "per_seq_overhead_s": (1e-8, 5e-5)}
EFFICIENCY_BOUNDS = (0.05, 1.25)  # of the GPU's bandwidth or FLOP rate in sim.hardware (H200's copy bandwidth
# understates what its decode kernels read: the profiles imply up to 1.1 of it)
# The constants before the fit (leads from other engines' kernels; no step was cheaper for repeating its batch)
LEADS = {"matmul_efficiency": 0.8, "weight_bandwidth_efficiency": 0.85, "kv_bandwidth_efficiency": 0.7,
         "attention_flops_efficiency": 0.45, "step_overhead_s": 1.5e-3, "continuing_step_overhead_s": 1.5e-3,
         "per_seq_overhead_s": 4e-6, "per_layer_overhead_s": 25e-6}
MAX_KV_TOKENS = 500_000  # the profiles measured decode batches up to ~525k KV tokens: no extrapolation is compared


def _batch(decode_rows: int, decode_context: int, chunks: list[tuple[int, int]], continues: int = 0) -> ScheduledBatch:
    """decode_rows rows at decode_context tokens each, and prefill chunks of (new tokens, cached tokens); ``continues``:
    a decode step that repeats the batch before it (planned while that one ran)."""
    return _scheduled(
        [1] * decode_rows + [q for q, _ in chunks], num_prefill_seqs=len(chunks),
        num_prefill_tokens=sum(q for q, _ in chunks), prefill_context_tokens=sum(c for _, c in chunks),
        num_decode_seqs=decode_rows, decode_context_tokens=decode_rows * decode_context,
        max_decode_context_tokens=decode_context if decode_rows else 0,
        prefill_attention_pairs=sum(q * c + q * (q + 1) // 2 for q, c in chunks), continues_batch=continues)


def _scheduled(num_new_tokens: list[int], num_seqs: int | None = None, **features: int) -> ScheduledBatch:
    """A batch with the step features a cost model reads (a step log row's names), of ``num_seqs`` sequences (one a
    row of ``num_new_tokens`` where not given)."""
    count = len(num_new_tokens) if num_seqs is None else num_seqs
    return ScheduledBatch(seqs=[Sequence(i, [1], SamplingParams()) for i in range(count)],
                          num_new_tokens=num_new_tokens, **features)


def grid() -> list[tuple[str, ScheduledBatch]]:
    """(kind, batch) for the batches compared."""
    batches = []
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for context in (128, 512, 2048, 8192):
            if rows * context <= MAX_KV_TOKENS:
                # Most of a serving run's decode steps repeat the batch before them; the others pay its planning
                batches.append(("decode", _batch(rows, context, [], continues=1)))
                batches.append(("decode_new_batch", _batch(rows, context, [])))
    for tokens in (256, 1024, 2048, 4096, 8192):
        for cached in (0, 2048, 8192):
            batches.append(("prefill", _batch(0, 0, [(tokens, cached)])))
    for rows in (16, 64, 128):
        rest = 8192 - rows
        batches.append(("mixed", _batch(rows, 2048, [(rest, 0)])))
        batches.append(("mixed", _batch(rows, 2048, [(rest // 4, 1024)] * 4)))
    return batches


SERVING_SAMPLES = 100  # steps taken from each serving replay below


def serving_batches() -> list[tuple[str, ScheduledBatch]]:
    """Batches as serving forms them, which the grid's uniform ones miss (contexts of one batch that differ, several
    prefill chunks beside decode rows): every k-th step of traces/sharegpt.parquet simulated under each model's H200
    profile at two loads (qwen3-0.6b 20 and 40 req/s, qwen3-8b 8 and 20: about half its capacity and near it)."""
    import polars as pl

    from sim.simulator import simulate
    from traces.schema import load_trace

    trace = load_trace(ROOT / "traces" / "sharegpt.parquet")
    batches = []
    for model, qps in (("qwen3-0.6b", 20.0), ("qwen3-0.6b", 40.0), ("qwen3-8b", 8.0), ("qwen3-8b", 20.0)):
        config = SimConfig(model=model, gpu="h200")
        steps = pl.from_arrow(simulate(trace.with_qps(qps), config,
                                       cost_model=make_cost_model(config, config.model_shape)).steps_table())
        every = max(1, steps.height // SERVING_SAMPLES)
        rows = steps.gather_every(every).head(SERVING_SAMPLES).select(
            "num_seqs", "num_prefill_seqs", "num_prefill_tokens", "prefill_context_tokens", "num_decode_seqs",
            "decode_context_tokens", "max_decode_context_tokens", "prefill_attention_pairs", "continues_batch")
        batches += [("serving", _scheduled([1] * row["num_decode_seqs"], **row)) for row in rows.iter_rows(named=True)]
    return batches


def profile_prices(batches) -> dict[tuple[str, str], list[float]]:
    prices = {}
    for gpu, model in PAIRS:
        config = SimConfig(model=model, gpu=gpu)
        cost_model = make_cost_model(config, config.model_shape)
        prices[(gpu, model)] = [cost_model.step_time_s(batch) for _, batch in batches]
    return prices


def log_errors(constants: RooflineConstants, batches, prices, pairs) -> list[float]:
    errors = []
    for gpu, model in pairs:
        config = SimConfig(model=model, gpu=gpu)
        roofline = RooflineCostModel(config.model_shape, get_gpu(gpu), constants=constants)
        errors += [math.log(roofline.step_time_s(batch) / price)
                   for (_, batch), price in zip(batches, prices[(gpu, model)], strict=True)]
    return errors


def _loss(values: dict, batches, prices, pairs) -> float:
    constants = RooflineConstants(**{**LEADS, **values})
    return sum(e * e for e in log_errors(constants, batches, prices, pairs))


def fit(batches, prices, pairs, sweeps: int = 12) -> dict[str, float]:
    """Coordinate descent in log space: each constant in turn by golden-section search within its bounds."""
    values = {name: LEADS[name] for name in FITTED}  # (from the leads: the result does not follow the shipped values)
    for _ in range(sweeps):
        for name in FITTED:
            low, high = (math.log(v) for v in BOUNDS.get(name, EFFICIENCY_BOUNDS))

            def loss_at(x: float, name=name) -> float:
                return _loss({**values, name: math.exp(x)}, batches, prices, pairs)
            ratio = (math.sqrt(5) - 1) / 2
            a, b = low, high
            c, d = b - ratio * (b - a), a + ratio * (b - a)
            fc, fd = loss_at(c), loss_at(d)
            for _ in range(40):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - ratio * (b - a)
                    fc = loss_at(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + ratio * (b - a)
                    fd = loss_at(d)
            best = (a + b) / 2
            if loss_at(best) < _loss(values, batches, prices, pairs):
                values[name] = math.exp(best)
    return values


def error_stats(errors: list[float], kinds: list[str]) -> dict:
    """Mean and largest |roofline / profile - 1| (%), overall and per kind of step."""
    def stats(selected: list[float]) -> dict:
        percent = [abs(math.exp(e) - 1) * 100 for e in selected]
        signed = [(math.exp(e) - 1) * 100 for e in selected]
        return {"mean_abs_error_pct": round(sum(percent) / len(percent), 1),
                "max_abs_error_pct": round(max(percent), 1), "mean_error_pct": round(sum(signed) / len(signed), 1)}
    out = {"all": stats(errors)}
    for kind in dict.fromkeys(kinds):
        out[kind] = stats([e for e, k in zip(errors, kinds, strict=True) if k == kind])
    return out


def _error_text(kind: str, stats: dict) -> str:
    return f"{kind} {stats['mean_abs_error_pct']:.1f}% (max {stats['max_abs_error_pct']:.0f})"


def replays(trace: Trace, constants: dict[str, RooflineConstants]) -> dict:
    """TTFT and TPOT p50/p90 (ms) of the trace (at its --qps) replayed on the H200, for each model under its profile
    and under the roofline with each set of ``constants``: how the steps' errors add up in a serving run."""
    import polars as pl

    from analysis.metrics import summarize
    from sim.simulator import simulate

    out = {}
    for model in ("qwen3-0.6b", "qwen3-8b"):
        config = SimConfig(model=model, gpu="h200")
        models = {"profile": make_cost_model(config, config.model_shape)}
        models.update({f"roofline ({label})": RooflineCostModel(config.model_shape, get_gpu("h200"), constants=c)
                       for label, c in constants.items()})
        for label, cost_model in models.items():
            requests = pl.from_arrow(simulate(trace, config, cost_model=cost_model).requests_table())
            summary = summarize(requests, None, vllm_names=False)
            out[f"{model} {label}"] = {f"{metric}_{stat}_ms": round(summary[f"{metric}_ms"][stat], 2)
                                       for metric in ("ttft", "tpot") for stat in ("p50", "p90")}
    return out


HEADLINE = [(metric, stat) for metric in ("ttft", "tpot", "e2e") for stat in ("p50", "p90")]


def gpu_run_errors(run_dir: Path, constants: dict[str, RooflineConstants], gpu: str) -> dict:
    """A GPU run (its summary.json: the trace, --qps, --limit and the engine's options) simulated again under the
    roofline with each set of ``constants``: the headline latencies and their errors against the run's (%)."""
    import polars as pl

    from analysis.metrics import summarize
    from sim.simulator import simulate
    from traces.schema import load_trace

    real = json.loads((run_dir / "summary.json").read_text())
    options = real["config"]
    trace_path = Path(options["trace"])
    trace = load_trace(trace_path if trace_path.is_absolute() else ROOT / trace_path)
    if options.get("limit"):
        trace = trace.head(options["limit"])
    if options.get("qps"):
        trace = trace.with_qps(options["qps"])
    config = SimConfig(model=options["model"], gpu=gpu, max_model_len=options["max_model_len"],
                       num_gpu_blocks=options["num_gpu_blocks"], block_size=options["block_size"],
                       max_num_seqs=options["max_num_seqs"], max_num_batched_tokens=options["max_num_batched_tokens"],
                       enable_prefix_caching=options["enable_prefix_caching"], policy=options["policy"])
    out = {"run": run_dir.name, "model": options["model"], "gpu": gpu, "qps": options.get("qps"),
           "real_ms": {f"{metric}_{stat}": real[f"{metric}_ms"][stat] for metric, stat in HEADLINE}}
    for label, c in constants.items():
        requests = pl.from_arrow(simulate(trace, config, cost_model=RooflineCostModel(
            config.model_shape, get_gpu(gpu), constants=c)).requests_table())
        summary = summarize(requests, None, vllm_names=False)
        simulated = {f"{metric}_{stat}": summary[f"{metric}_ms"][stat] for metric, stat in HEADLINE}
        out[f"{label}_ms"] = {key: round(value, 2) for key, value in simulated.items()}
        out[f"{label}_error_pct"] = {key: round(100 * (value / out["real_ms"][key] - 1), 1)
                                     for key, value in simulated.items()}
    return out


def run_problem(run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot be checked (no readable summary.json of an engine.replay run, or its trace missing), or
    None: asked of every --real folder before any work (a missing one was a traceback after the whole fit)."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        return (f"--real {run_dir}: no readable summary.json ({type(exc).__name__}); expected an engine.replay run "
                "folder")
    options = summary.get("config") if isinstance(summary, dict) else None
    needed = ("trace", "model", "max_model_len", "num_gpu_blocks", "block_size", "max_num_seqs",
              "max_num_batched_tokens", "enable_prefix_caching", "policy")
    if not isinstance(options, dict) or any(options.get(key) is None for key in needed) or not all(
            isinstance(summary.get(f"{metric}_ms"), dict) for metric, _ in HEADLINE):
        return (f"--real {run_dir}: summary.json lacks the run's config ({', '.join(needed)}) or its latencies; "
                "expected an engine.replay run folder")
    from sim.run_kind import simulated_by

    if simulated_by(run_dir):
        return f"--real {run_dir}: a simulated run; expected a GPU run (engine.replay)"
    trace = Path(options["trace"])
    if not (trace if trace.is_absolute() else ROOT / trace).is_file():
        return f"--real {run_dir}: its trace {trace} does not exist (python validation/make_traces.py makes the slices)"
    return None


def main(argv: list[str] | None = None) -> int:
    from engine.core.config_args import OneLineErrorParser
    from sim.files import check_output_path
    from sim.hardware import GPUS
    from traces.schema import TraceError, load_trace

    parser = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--trace", type=Path, default=ROOT / "traces" / "sharegpt.parquet",
                        help="the trace replayed under each model (default: traces/sharegpt.parquet)")
    parser.add_argument("--qps", type=float, default=20.0, help="its rate (default: 20 req/s)")
    parser.add_argument("--real", type=Path, nargs="*", default=[], metavar="RUN",
                        help="GPU run folders (engine.replay; their summary.json is read) of models no profile was "
                             "measured for, each simulated again under the roofline: held-out checks")
    parser.add_argument("--gpu", default="h100", choices=sorted(GPUS), type=str.lower,
                        help="the GPU those runs were made on (default: %(default)s)")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.qps) and args.qps > 0):
        parser.exit(2, f"error: --qps must be a finite number > 0, got {args.qps}\n")
    if not args.trace.exists():
        parser.exit(2, f"error: --trace {args.trace} does not exist\n")
    try:  # read before the fits: a folder or a file of another kind failed only after them, minutes later
        trace = load_trace(args.trace).with_qps(args.qps)
    except (TraceError, ValueError) as exc:
        parser.exit(2, f"error: --trace {args.trace}: {exc}\n")
    # The same run given twice weighed double in the mean error over the runs.
    problems = [repeated_input_problem(args.real, "--real"),
                *(problem for problem in (run_problem(run) for run in args.real) if problem)]
    if args.json is not None:
        # (the runs' summary.json files are inputs: --json naming one replaced it)
        inputs = [args.trace, *(run / "summary.json" for run in args.real)]
        problems.append(check_output_path(args.json, "--json", inputs))
        if not args.json.resolve().parent.is_dir():
            problems.append(f"--json: the folder of {args.json} does not exist")
    problem = next((p for p in problems if p), None)
    if problem:
        parser.exit(2, f"error: {problem}\n")
    batches = grid() + serving_batches()
    kinds = [kind for kind, _ in batches]
    prices = profile_prices(batches)

    def evaluate(constants: RooflineConstants, pairs) -> dict:
        return {f"{gpu}/{model}": error_stats(log_errors(constants, batches, prices, [(gpu, model)]), kinds)
                for gpu, model in pairs}

    def rounded(values: dict) -> dict:
        return {name: float(f"{value:.3g}") for name, value in values.items()}

    result = {"num_batches": len(batches), "leads": LEADS, "leads_errors": evaluate(RooflineConstants(**LEADS), PAIRS),
              "shipped": {gpu: dataclasses.asdict(roofline_constants_for(gpu)) for gpu in ("h200", "h100", "default")},
              "shipped_errors": {**evaluate(roofline_constants_for("h200"), PAIRS[:2]),
                                 **evaluate(roofline_constants_for("h100"), PAIRS[2:])}}
    # Each GPU's constants from its own two profiles (what RooflineCostModel uses on that GPU), and the fit on all
    # four for the GPUs no profile was measured on
    by_gpu = {gpu: [p for p in PAIRS if p[0] == gpu] for gpu in ("h200", "h100")}
    result["fitted"] = {gpu: rounded(fit(batches, prices, pairs)) for gpu, pairs in by_gpu.items()}
    result["fitted"]["default"] = rounded(fit(batches, prices, PAIRS))
    held_out = {}
    for label, train, test in [
            ("fit on h200, priced on h100", by_gpu["h200"], by_gpu["h100"]),
            ("fit on h100, priced on h200", by_gpu["h100"], by_gpu["h200"]),
            ("fit on all four, priced on each", PAIRS, PAIRS),
            *[(f"fit on {gpu}/{train_model}, priced on {gpu}/{test_model}", [(gpu, train_model)], [(gpu, test_model)])
              for gpu in ("h200", "h100") for train_model, test_model in [("qwen3-0.6b", "qwen3-8b"),
                                                                           ("qwen3-8b", "qwen3-0.6b")]]]:
        values = fit(batches, prices, train)
        held_out[label] = {"constants": rounded(values),
                           "errors": evaluate(RooflineConstants(**{**LEADS, **values}), test)}
    result["held_out"] = held_out
    trace_path = args.trace.resolve()
    result["replays"] = {"trace": str(trace_path.relative_to(ROOT) if trace_path.is_relative_to(ROOT) else trace_path),
                         "qps": args.qps, "gpu": "h200",
                         "results": replays(trace, {"leads": RooflineConstants(**LEADS),
                                                                   "shipped": roofline_constants_for("h200")})}
    for key in ("leads_errors", "shipped_errors"):
        print(key)
        for pair, stats in result[key].items():
            print(f"  {pair:18s} " + "  ".join(_error_text(kind, s) for kind, s in stats.items()))
    for gpu, values in result["fitted"].items():
        print(f"fitted ({gpu}):", values)
    for label, held in held_out.items():
        print(label)
        for pair, stats in held["errors"].items():
            print(f"  {pair:18s} {_error_text('all', stats['all'])}")
    print(f"replays of {args.trace} at {args.qps} req/s on the H200 (ms):")
    for label, figures in result["replays"]["results"].items():
        print(f"  {label:32s} " + "  ".join(f"{key} {value}" for key, value in figures.items()))
    # The leads, the GPU's own fit (what ships) and the fit on all four profiles (what a GPU without profiles gets)
    runs_constants = {"leads": RooflineConstants(**LEADS), "shipped": roofline_constants_for(args.gpu),
                      "fit on all four": RooflineConstants()}
    result["gpu_runs"] = [gpu_run_errors(run, runs_constants, args.gpu) for run in args.real]
    if result["gpu_runs"]:  # mean |error| over every run's headline figures, per set of constants
        result["gpu_runs_mean_abs_error_pct"] = {
            label: round(sum(abs(value) for run in result["gpu_runs"] for value in run[f"{label}_error_pct"].values())
                         / (len(result["gpu_runs"]) * len(HEADLINE)), 1) for label in runs_constants}
        print("mean |error| over the runs' figures (%):", result["gpu_runs_mean_abs_error_pct"])
    for run in result["gpu_runs"]:
        print(f"{run['run']} ({run['model']} on {run['gpu']} at {run['qps']} req/s): error vs the GPU run (%)")
        for label in runs_constants:
            errors = run[f"{label}_error_pct"]
            print(f"  {label:15s} " + "  ".join(f"{key} {value:+.1f}" for key, value in errors.items()))
    if args.json:
        write_text_atomic(args.json, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(one_line_script_errors(main)())
