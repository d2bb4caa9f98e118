"""Where a simulated run leaves what the simulator was measured and validated on: the ``warnings`` list of
summary.json, printed by ``sim.replay`` and shown in the report.

Each warning is ``{"code", "message", "value", "limit"}``: a stable code to test and filter on, one line
naming the limit and the run's figure, and the two figures. Warnings describe the run; they never change it.

- ``beyond_grid_*``: steps whose shape lies outside the measured profile's grid (batch tokens, sequences per
  step, prefill context, longest and total decode context): their times are extrapolated by the fit.
- ``past_saturation``: the waiting queue still grows over the last third of the arrivals: the offered load
  exceeds what the deployment serves, and latencies grow with the run's length instead of settling.
- ``kv_blocks_beyond_memory``: ``--num-gpu-blocks`` asks for more KV blocks than all of the GPU's memory holds
  beside the model's weights and activations (a what-if the simulator runs, but no real engine could).
- ``no_profile``: no measured profile for this model, GPU and tensor-parallel size (or a --model folder named as a
  profiled model holds another one): the step times are the roofline estimate. ``profile_engine_options``: the
  profile was measured with other engine options (block size, token budget, batch size limit), which change step
  times. A profile of another model, GPU or tensor-parallel size is an error before the run
  (``ProfiledCostModel.load``), not a warning.
- ``sampling_not_measured``: the requests sample (--temperature, --top-k, --top-p) but the cost model has no
  measured cost of that sampling (a profile measured before sim.profile timed sampled steps, or the roofline
  estimate): steps are priced as greedy ones, short by what the sampler adds. ``sampling_below_greedy``: it has,
  but some sampled points measured faster than greedy steps of their size (priced with no sampling cost there).
- ``unpriced_decode_skew``: decode steps of a few rows (4 up to the smallest batch the profile measured one long
  context among short ones at) whose longest context exceeds their mean by ``SKEW_EXCESS_TOKENS`` or more, which the
  profile prices as free (long-context traffic: Mooncake's). GPU runs measured such steps longer than priced, so the
  run's TPOT and E2E lean optimistic.
- ``images_not_simulated``: requests of the trace carry images (``num_images``, kept from the Azure 2025 multimodal
  trace), which the simulated model, text only, never sees: their prefills are priced without encoding them.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from engine.core.messages import escape_controls, long_name_message
from engine.core.model_config import CONFIG_DIR, ModelShape, shipped_models
from sim.config import SimConfig
from sim.cost_model import num_kv_blocks_for
from sim.files import read_json_input
from sim.hardware import get_gpu
from sim.profiled_cost_model import PROFILE_DIR, _is_graph_step, find_profile, profile_path

REPO = PROFILE_DIR.parents[1]  # profile paths in messages are relative to it, whatever the checkout

# The queue must absorb at least this share of the requests that arrived in the last third of the arrivals
# (and at least MIN_QUEUE_GROWTH requests) to count as growing: a stable queue near saturation wanders by less.
QUEUE_GROWTH_SHARE = 0.1
MIN_QUEUE_GROWTH = 5
# Engine options that change step times (a profile measured with others prices other steps).
TIMED_OPTIONS = ("block_size", "max_num_batched_tokens", "max_num_seqs")
# The model's settings that change step times: a profile prices the model it was measured on and no other.
TIMED_SHAPE = ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
               "head_dim", "vocab_size")


@dataclass(frozen=True)
class GridRange:
    """The largest step shapes a profile measured, per regime (eager steps; CUDA-graph decode steps)."""

    eager_batch_tokens: int
    eager_num_seqs: int
    prefill_context_tokens: int  # cached context plus new tokens of a step's prefills
    decode_num_seqs: int
    longest_decode_context: int
    decode_kv_tokens: int  # KV tokens read by a step's decode rows


def grid_range(profile: dict) -> GridRange:
    """The range of ``profile``'s measured points (a profile JSON as ``sim.profile`` writes it)."""
    max_graph_bs = max((profile.get("engine_options") or {}).get("cuda_graph_sizes") or [0])
    features = [p["features"] for p in profile["points"]]
    eager = [f for f in features if not _is_graph_step(f, max_graph_bs)] or [{}]

    def largest(rows: list[dict], value) -> int:
        return max((value(f) for f in rows if f), default=0)

    return GridRange(
        eager_batch_tokens=largest(eager, lambda f: f["num_prefill_tokens"] + f["num_decode_seqs"]),
        eager_num_seqs=largest(eager, lambda f: f["num_seqs"]),
        prefill_context_tokens=largest(eager, lambda f: f["prefill_context_tokens"] + f["num_prefill_tokens"]),
        decode_num_seqs=largest(features, lambda f: f["num_decode_seqs"]),
        longest_decode_context=largest(features, _longest_context),
        decode_kv_tokens=largest(features, lambda f: f["decode_context_tokens"]),
    )


def _longest_context(f: dict) -> int:
    if "max_decode_context_tokens" in f:
        return f["max_decode_context_tokens"]
    return f["decode_context_tokens"] // f["num_decode_seqs"] if f["num_decode_seqs"] else 0


def warning(code: str, message: str, value: float | int | None = None, limit: float | int | None = None) -> dict:
    return {"code": code, "message": message, "value": value, "limit": limit}


def chosen_profile(config: SimConfig, model: ModelShape) -> Path | None:
    """The profile JSON ``sim.simulator.make_cost_model`` prices this run with (None: the roofline)."""
    if config.cost_model == "roofline":
        return None
    if config.cost_model == "auto":
        if other_model_of_that_name(model) is not None:
            return None
        return find_profile(model.name, config.gpu, config.tensor_parallel_size)
    path = Path(config.cost_model)
    try:
        path.stat()
    except OSError as exc:  # a missing file is make_cost_model's to refuse, by name
        if exc.errno == errno.ENAMETOOLONG:
            # Every reader's Path test of it raised: analysis.capacity blamed its --out ("--out DIR: File name too
            # long"), which catches OSError as a failed write.
            raise ValueError(long_name_message(exc)) from None
    return path


def other_model_of_that_name(model: ModelShape) -> str | None:
    """How ``model``, from a folder named as a shipped config, differs from that config in what step times depend on
    (None: it does not, or no shipped config has its name). Profiles are found by the folder's name: a folder named
    qwen3-0.6b holding another model's config.json was priced by qwen3-0.6b's measured step times, without a word.
    The name is matched in any case, as ProfiledCostModel.load matches a profile's: a folder Qwen3-0.6B holding
    another model took --cost-model sim/profiles/h200/qwen3-0.6b.json at exit 0."""
    name = next((s for s in shipped_models() if s.lower() == model.name.lower()), None)
    if name is None:
        return None
    shipped = ModelShape.load(CONFIG_DIR / name)
    return next((f"{field} {getattr(model, field)}, not {getattr(shipped, field)}" for field in TIMED_SHAPE
                 if getattr(model, field) != getattr(shipped, field)), None)


def profile_warnings(config: SimConfig, model: ModelShape, profile: dict | None) -> list[dict]:
    """``no_profile``, ``sampling_not_measured`` (or ``sampling_below_greedy``) and ``profile_engine_options``."""
    if profile is None:
        return [_no_profile_warning(config, model), *sampling_warning(config, model, None)]
    measured = profile.get("engine_options") or {}
    out = sampling_warning(config, model, profile)
    for name in TIMED_OPTIONS:
        was, asked = measured.get(name), getattr(config, name)
        if was is not None and was != asked:
            out.append(warning("profile_engine_options", f"{name} is {asked:,} but the profile was measured at "
                                                         f"{was:,}: its step times are for other batches", asked, was))
    return out


def _no_profile_warning(config: SimConfig, model: ModelShape) -> dict:
    if config.cost_model == "roofline":
        return warning("no_profile", "cost model: the roofline estimate (--cost-model roofline), not measured step "
                                     "times; its latencies are not validated against a GPU")
    looked = profile_path(model.name, config.gpu, config.tensor_parallel_size).relative_to(REPO)
    other = other_model_of_that_name(model)
    if other is not None:
        return warning("no_profile", f"the model is named {model.name} but is another model ({other}), so {looked} "
                                     "does not price it: step times are the roofline estimate, not validated against "
                                     "a GPU")
    return warning("no_profile", f"no measured profile for {model.name} on {config.gpu} at tensor-parallel size "
                                 f"{config.tensor_parallel_size} ({looked} does not exist): step times are the "
                                 "roofline estimate, not validated against a GPU")


# A sampled point this much faster than its greedy twin is no noise (the twins of the shipped profiles differ by 1 %
# or less where sampling adds nothing measurable): qwen3-0.6b's filtered steps of 1 and 8 rows, timed alone after the
# step launched ahead of them, took 0.29 and 0.91 ms against greedy's 1.43 and 1.52, and the fit prices their sampling
# as free.
BELOW_GREEDY_SHARE = 0.10
# How the warnings word each sampling mode that is not greedy (SimConfig.sampling_mode).
_SAMPLING_WORDS = {"filters": "with top-k or top-p", "temperature": "with a temperature"}


def sampling_warning(config: SimConfig, model: ModelShape, profile: dict | None) -> list[dict]:
    """``sampling_not_measured``: the requests sample in a way the cost model has no measured cost of;
    ``sampling_below_greedy``: it has, but some of its sampled points measured faster than greedy steps."""
    mode = config.sampling_mode(model.vocab_size)
    fit = (profile or {}).get("fit")
    measured = (fit.get("sampling") if isinstance(fit, dict) else None) or {}
    if mode == "greedy":
        return []
    if mode in measured:
        return _sampled_below_greedy(profile, mode)
    what = _SAMPLING_WORDS[mode]
    source = "the roofline estimate prices no sampling" if profile is None else \
        "the profile has no sampled steps (measured before python -m sim.profile timed them)"
    return [warning("sampling_not_measured", f"every request samples {what}, but {source}: steps are priced as "
                                             "greedy ones, short by what the sampler adds")]


def _sampled_below_greedy(profile: dict, mode: str) -> list[dict]:
    """``sampling_below_greedy`` where some of the profile's sampled points of ``mode`` took BELOW_GREEDY_SHARE less
    than their greedy twins: sampling priced as free at those row counts, by a measurement not to be trusted."""
    below = []
    for point in profile.get("sampling_points") or ():
        if not isinstance(point, dict) or point.get("sampling") != mode:
            continue
        median_s, greedy_s, decode = point.get("median_s"), point.get("greedy_median_s"), point.get("decode")
        if all(isinstance(v, int | float) for v in (median_s, greedy_s)) and isinstance(decode, list) and decode \
                and median_s < (1 - BELOW_GREEDY_SHARE) * greedy_s:
            below.append((decode[0], median_s, greedy_s))
    if not below:
        return []
    what = _SAMPLING_WORDS[mode]
    rows = ", ".join(str(bs) for bs, _, _ in sorted(below))
    times = ", ".join(f"{m * 1e3:.2f} against {g * 1e3:.2f} ms" for _, m, g in sorted(below))
    return [warning("sampling_below_greedy", f"the profile's decode steps sampling {what} at {rows} rows measured "
                                             f"faster than greedy ones ({times}): not a cost to trust, and steps of "
                                             "about those sizes are priced with little or no sampling cost")]


def sampling_note(config: SimConfig, model: ModelShape) -> str | None:
    """``sampling_warning``'s message for ``config``'s cost model before any run (analysis.capacity's notes), or None
    where the requests are greedy or their sampling is priced as measured."""
    path = chosen_profile(config, model)
    profile = json.loads(read_json_input(path)) if path is not None else None
    warnings = sampling_warning(config, model, profile if isinstance(profile, dict) else None)
    return warnings[0]["message"] if warnings else None


def _beyond(steps: pl.DataFrame, num_steps: int, values: pl.Expr, limit: int, code: str, what: str) -> list[dict]:
    """A warning when some of ``steps`` exceed ``limit``; ``num_steps``: all the run's steps, for the share."""
    over = steps.select(values.alias("v")).filter(pl.col("v") > limit)
    if over.height == 0:
        return []
    largest = int(over["v"].max())
    share = over.height / num_steps
    return [warning(code, f"{over.height:,} of {num_steps:,} steps ({share:.1%}) have {what} up to {largest:,}, "
                          f"beyond the profile grid's largest measured {limit:,}: their times are extrapolated",
                    largest, limit)]


def grid_warnings(steps: pl.DataFrame, grid: GridRange, max_graph_bs: int) -> list[dict]:
    """``beyond_grid_*``: one warning per dimension in which some steps exceed the grid."""
    if steps.height == 0:
        return []
    graph = (pl.col("num_prefill_tokens") == 0) & (pl.col("num_decode_seqs") > 0) & (
        pl.col("num_decode_seqs") <= max_graph_bs)
    # The columns read, before the filter: filtering the whole step log copied all 21 columns of its eager rows (16 ms
    # on the Azure trace's 1.78M steps instead of 6).
    eager = steps.select("num_prefill_tokens", "num_decode_seqs", "num_batched_tokens", "num_seqs",
                         "prefill_context_tokens").filter(~graph)
    prefill_kv = pl.col("prefill_context_tokens") + pl.col("num_prefill_tokens")
    longest = (pl.col("max_decode_context_tokens") if "max_decode_context_tokens" in steps.columns
               else pl.col("decode_context_tokens") // pl.max_horizontal(pl.col("num_decode_seqs"), 1))
    out = []
    n = steps.height
    if eager.height:
        out += _beyond(eager, n, pl.col("num_batched_tokens"), grid.eager_batch_tokens, "beyond_grid_batch_tokens",
                       "eager batches of tokens")
        out += _beyond(eager, n, pl.col("num_seqs"), grid.eager_num_seqs, "beyond_grid_num_seqs",
                       "eager batches of sequences")
        # Summed over the step's prefills, as the grid's points sum it: "prefill context up to 65,223" beside a
        # max_model_len of 40,960 read as a request longer than the limit.
        out += _beyond(eager, n, prefill_kv, grid.prefill_context_tokens, "beyond_grid_prefill_context",
                       "prefill context (cached + new tokens, summed over the step's prefills)")
    out += _beyond(steps, n, pl.col("num_decode_seqs"), grid.decode_num_seqs, "beyond_grid_decode_seqs",
                   "decode batches of sequences")
    out += _beyond(steps, n, longest, grid.longest_decode_context, "beyond_grid_decode_context",
                   "a longest decode context")
    out += _beyond(steps, n, pl.col("decode_context_tokens"), grid.decode_kv_tokens, "beyond_grid_decode_kv_tokens",
                   "decode KV tokens read")
    return out


# unpriced_decode_skew: the decode batches it speaks of, and how far their longest context must exceed the mean. On
# the H200 (qwen3-0.6b, the thirty-fifth session's three Mooncake runs, validation/results/h100-session36-2026-12-06/
# skew-tried/) repeating decode steps of 8-15 rows read 1.005 of their real time at 5-12k tokens of excess, 0.925 at
# 10-25k and 0.89 beyond 20k (4-7 rows 0.93 beyond 20k; 1-3 rows were priced long, 1.04-1.10); on an H100, 0.93-0.95
# at the largest excess. Pricing that excess from twin grid points over-priced serving's batches, which hold several
# long contexts (tried and not shipped, same folder): the simulator says so instead.
SKEW_MIN_ROWS = 4
SKEW_EXCESS_TOKENS = 10_000
SKEW_MIN_SHARE = 0.01  # of the run's steps: a handful of such steps moves no latency figure


def skew_warning(steps: pl.DataFrame, profile: dict, max_graph_bs: int) -> list[dict]:
    """``unpriced_decode_skew`` when at least SKEW_MIN_SHARE of the run's steps decode SKEW_MIN_ROWS rows or more,
    fewer than the profile prices the excess of a long context for (its fit's ``skew_min_batch_size``; every graph
    batch where it prices none), their longest context SKEW_EXCESS_TOKENS or more above their mean."""
    decode = ((profile.get("fit") or {}).get("graph_decode")) or {}
    priced_from = int(decode.get("skew_min_batch_size", 0)) if decode.get("per_excess_context_token_s") else \
        max_graph_bs + 1
    if steps.height == 0 or "max_decode_context_tokens" not in steps.columns or priced_from <= SKEW_MIN_ROWS:
        return []
    rows = pl.col("num_decode_seqs")
    excess = pl.col("max_decode_context_tokens") - pl.col("decode_context_tokens") / pl.max_horizontal(rows, 1)
    skewed = steps.select(rows, excess.alias("excess"), pl.col("num_prefill_tokens")).filter(
        (pl.col("num_prefill_tokens") == 0) & (rows >= SKEW_MIN_ROWS) & (rows < priced_from)
        & (pl.col("excess") >= SKEW_EXCESS_TOKENS))
    share = skewed.height / steps.height
    if share < SKEW_MIN_SHARE:
        return []
    largest = int(skewed["excess"].max())
    priced = f"only from {priced_from} rows" if priced_from <= max_graph_bs else "in no decode batch"
    return [warning(
        "unpriced_decode_skew",
        f"{skewed.height:,} of {steps.height:,} steps ({share:.1%}) decode {SKEW_MIN_ROWS}-{priced_from - 1} rows "
        f"whose longest context exceeds their mean by {SKEW_EXCESS_TOKENS:,} tokens or more (up to {largest:,}): the "
        f"profile prices that excess {priced}; on GPU runs of long-context traffic such steps took 5-12 % longer "
        "than priced, so TPOT and E2E lean optimistic", largest, SKEW_EXCESS_TOKENS)]


def _trend(t_s: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of ``values`` over ``t_s`` (per second), from centred sums: np.polyfit's
    Vandermonde matrix and SVD held several copies of a long step log's window (65 MB on the Azure trace)."""
    centred_t_s = t_s - t_s.mean()
    return float(centred_t_s @ (values - values.mean()) / (centred_t_s @ centred_t_s))


def saturation_warning(steps: pl.DataFrame, arrivals_s: np.ndarray, replicas: np.ndarray | None = None) -> list[dict]:
    """``past_saturation``: on any replica, the waiting count's least-squares trend over the steps that start in
    the last third of the arrival window grows the queue by at least QUEUE_GROWTH_SHARE of the requests that
    arrived at that replica then (and MIN_QUEUE_GROWTH), and its later half waits longer (median) than its earlier
    half. After the last arrival every queue drains, so the end of the arrivals is the end that matters; a run
    whose requests all arrive at once (offline) is a batch, never saturated.

    ``replicas``: the replica each arrival was queued on (-1: never queued, a rejected request); None: every
    arrival on the one replica. Weighed against every arrival of the fleet, a replica's queue had to grow by
    N times its own share of them: ten replicas, each as overloaded as one that warned, never did."""
    if steps.height == 0 or len(arrivals_s) < 2:
        return []
    first_s, last_s = float(arrivals_s.min()), float(arrivals_s.max())
    if last_s <= first_s:
        return []
    window_start_s = last_s - (last_s - first_s) / 3
    in_window = (arrivals_s >= window_start_s) & (arrivals_s <= last_s)
    worst = None
    # The three columns read, before the filter: filtering the whole step log copied every column of a third of its
    # rows (140 MB of the Azure trace's 1.78M steps, a tenth of what writing its outputs took at its peak).
    in_window_steps = steps.select("replica", "start_s", "num_waiting").filter(
        pl.col("start_s").is_between(window_start_s, last_s))
    for (replica,), group in in_window_steps.group_by("replica", maintain_order=True):
        if group.height < 8:
            continue
        t_s = group["start_s"].to_numpy().astype(float)
        waiting = group["num_waiting"].to_numpy().astype(float)
        if np.ptp(t_s) == 0:
            continue
        num_arrived = int((in_window if replicas is None else in_window & (replicas == replica)).sum())
        needed = max(MIN_QUEUE_GROWTH, QUEUE_GROWTH_SHARE * num_arrived)
        slope = _trend(t_s, waiting)
        growth = slope * (last_s - window_start_s)
        half = len(waiting) // 2
        rising = np.median(waiting[half:]) > np.median(waiting[:half])
        if growth >= needed and rising and (worst is None or growth > worst[1]):
            worst = (replica, growth, slope, float(waiting[0]), float(waiting[-1]), num_arrived, needed)
    if worst is None:
        return []
    replica, growth, slope, start_waiting, end_waiting, num_arrived, needed = worst
    reached = "arrived" if num_arrived == int(in_window.sum()) else "were queued on it"  # not all of them: say so
    return [warning("past_saturation",
                    f"replica {replica}'s waiting queue grew by {growth:,.0f} requests "
                    f"({slope:+.2f}/s, least-squares trend; {start_waiting:,.0f} -> {end_waiting:,.0f} waiting) over "
                    f"the last third of the arrivals ({window_start_s:.1f}-{last_s:.1f} s), at least "
                    f"{QUEUE_GROWTH_SHARE:.0%} of the {num_arrived:,} that {reached} then: the load exceeds what it "
                    "serves, and latencies grow with the run's length", round(growth, 1), round(needed, 1))]


def queued_replicas(requests) -> np.ndarray:
    """The replica each row of a run's requests table (pyarrow, ``engine.core.records``, or polars) was queued on,
    -1 for a rejected request (never queued): ``saturation_warning``'s ``replicas``."""
    frame = pl.DataFrame(requests.select(["replica", "finish_reason"]))
    rejected = (frame["finish_reason"] == "rejected").fill_null(False).to_numpy()
    return np.where(rejected, -1, frame["replica"].to_numpy())


def memory_warning(config: SimConfig, model: ModelShape) -> list[dict]:
    """``kv_blocks_beyond_memory``: an explicit --num-gpu-blocks above what all of the GPU's memory holds beside the
    weights and the activation peak. Not the engine's own sizing at --gpu-memory-utilization: that is an estimate
    a GPU may exceed by a few blocks (4,526 measured against 4,517 estimated on the H200), and a real engine can
    be given more of its memory."""
    asked = config.num_gpu_blocks
    if asked is None:
        return []
    gpu = get_gpu(config.gpu)
    try:
        holds = num_kv_blocks_for(model, gpu, config.block_size, 1.0, config.max_num_batched_tokens,
                                  config.tensor_parallel_size)
    except ValueError:  # not even the weights fit
        holds = 0
    if asked <= holds:
        return []
    return [warning("kv_blocks_beyond_memory",
                    f"--num-gpu-blocks {asked:,} is more KV blocks than all of the memory of "
                    f"{config.tensor_parallel_size}x {gpu.name} holds beside {model.name} ({holds:,} blocks of "
                    f"{config.block_size} tokens): a what-if no real engine could run", asked, holds)]


# The step columns ``run_warnings`` reads: the batches ``grid_warnings`` and ``skew_warning`` size up
# (max_decode_context_tokens where the log has it) and the queues ``saturation_warning`` follows.
WARNING_STEP_INPUTS: tuple[str, ...] = (
    "num_prefill_tokens", "num_decode_seqs", "num_batched_tokens", "num_seqs", "prefill_context_tokens",
    "max_decode_context_tokens", "decode_context_tokens", "replica", "start_s", "num_waiting",
)


def images_warning(trace_requests: pl.DataFrame) -> list[dict]:
    """``images_not_simulated`` when requests of the replayed trace carry images (a numeric ``num_images`` column,
    as traces.convert keeps it from the Azure 2025 multimodal trace; a column of that name holding anything else is
    not that count). No step of the simulated text-only model encodes an image: such a replay ran at exit 0, its
    summary silent on what the trace asked beyond the text."""
    images = trace_requests.get_column("num_images", default=None)
    if images is None or not images.dtype.is_numeric():
        return []
    # NaN (an unknown count) carries no image: it compared above 0, and "20 of 20 requests carry images (nan in all)".
    images = images.cast(pl.Float64).fill_nan(None)
    num_with_images = int((images > 0).sum())
    if num_with_images == 0:
        return []
    return [warning("images_not_simulated",
                    f"{num_with_images:,} of {trace_requests.height:,} requests carry images ({images.sum():,.0f} in "
                    "all, the trace's num_images), which the simulated model, text only, never sees: their prefills "
                    "are priced on prompt_tokens alone, without encoding the images", num_with_images, 0)]


def run_warnings(config: SimConfig, model: ModelShape, trace_requests: pl.DataFrame, steps: pl.DataFrame,
                 arrivals_s: np.ndarray, replicas: np.ndarray | None = None) -> list[dict]:
    """Every warning of a simulated run of ``trace_requests`` (the trace's rows as replayed), in a fixed order: the
    profile, the memory, the trace, the grid, the load (``replicas``: as ``saturation_warning`` takes them)."""
    path = chosen_profile(config, model)
    profile = json.loads(read_json_input(path)) if path is not None else None
    out = profile_warnings(config, model, profile) + memory_warning(config, model) + images_warning(trace_requests)
    if profile is not None and profile.get("points"):
        max_graph_bs = max((profile.get("engine_options") or {}).get("cuda_graph_sizes") or [0])
        out += grid_warnings(steps, grid_range(profile), max_graph_bs)
        out += skew_warning(steps, profile, max_graph_bs)
    return out + saturation_warning(steps, arrivals_s, replicas)


def format_warnings(warnings: list[dict]) -> str:
    """One line per warning, for the CLI ("" without any); control characters escaped (a --model folder's name
    holding an ANSI escape or a newline is quoted in the message)."""
    return "\n".join(escape_controls(f"warning [{w['code']}]: {w['message']}") for w in warnings)
