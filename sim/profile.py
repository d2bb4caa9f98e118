"""Measure real step times through the real engine, for the simulator's cost model (runs on the GPU).

``python -m sim.profile --model qwen3-0.6b --gpu h200 --out sim/profiles/h200/qwen3-0.6b.json --overwrite``

Each grid point puts the scheduler in a chosen state (sequences with a given cached context and a
given number of new tokens), then times whole engine steps: scheduling, input preparation, the
forward (a CUDA graph for decode-only steps, piecewise graphs around eager attention for prefill and
mixed steps up to ``max_cuda_graph_tokens``, eager beyond), sampling and postprocessing, as a
replay pays them. KV contents do not change the timing, so states are injected rather than
prefilled. The grid covers decode batches over context lengths (equal, and one long context among
short ones), the decode step right after an eager one, prefill chunks with and without a cached
prefix, multi-sequence prefills and mixed prefill+decode steps, and decode batches whose every row samples (with a
temperature; with top-k and top-p) beside greedy ones of the same shape, written apart as ``sampling_points`` (what
sampling adds to a step: sim.replay --temperature / --top-k / --top-p). As in serving, a batch's decode rows have run a
step before the timed one (so the scheduler knows a large batch's rows for plain decodes and checks only the rows
that need it), and none of them opens or fills a KV block in a timed step (``row_context``). Each point's repeats
are taken one per pass over the whole grid (``measure_grid``), so that the host's slow spells spread over all points
alike. Needs torch; not simpy.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.config import cdiv
from engine.core.config_args import OneLineErrorParser, add_config_arguments
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.messages import escape_controls
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.options import EngineOptions
from sim.batch_features import batch_features
from sim.hardware import host_info


@dataclass(frozen=True)
class GridPoint:
    family: str  # decode | decode_skewed | decode_after_eager | prefill | multi_prefill | mixed
    decode: tuple[int, int] = (0, 0)  # (num sequences, context tokens each)
    prefill: tuple[tuple[int, int], ...] = ()  # (cached context, new tokens) per prefilling sequence
    long_decode: tuple[int, int] = (0, 0)  # (num sequences, context tokens each) decoding beside the short ones
    sampling: str = "greedy"  # how every row samples (SAMPLING_PARAMS); a 'decode' point that does not is kept apart


# What each sampling mode's rows ask, as a request of a deployment would: the engine draws with temperature alone in
# one pass, and with top-k or top-p finds each row's floor first (engine.gpu.layers.sampler). The filter values do not
# change its passes; these are Qwen3's generation-config defaults, which engine.serve applies (as vLLM does).
SAMPLING_PARAMS = {"greedy": {"temperature": 0.0}, "temperature": {"temperature": 1.0},
                   "filters": {"temperature": 0.6, "top_k": 20, "top_p": 0.95}}
# Batch sizes of the sampled decode points (each beside the greedy 'decode' point of its size and SAMPLING_CONTEXT):
# the engine sorts filtered batches up to SORT_MAX_ROWS (48) rows and searches floors beyond, whose cost is flat up to
# about a row an SM and grows past it.
SAMPLING_BATCH_SIZES = (1, 8, 32, 48, 64, 128, 256, 512)
SAMPLING_CONTEXT = 1024


def build_grid(max_num_seqs: int, budget: int, max_model_len: int, max_kv_tokens: int, quick: bool,
               sampling_only: bool = False) -> list[GridPoint]:
    """The grid's points; with ``sampling_only``, the sampled decode points and the greedy ones beside them alone."""
    points = _full_grid(max_num_seqs, budget, max_model_len, max_kv_tokens, quick)
    if not sampling_only:
        return points
    sampled = {point.decode for point in points if point.sampling != "greedy"}
    return [point for point in points if point.family == "decode" and point.decode in sampled]


def _full_grid(max_num_seqs: int, budget: int, max_model_len: int, max_kv_tokens: int, quick: bool) -> list[GridPoint]:
    graph_sizes = [b for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
                   if b <= max_num_seqs]
    # 2048: a full batch of 2k contexts reads more KV than any other point of a large model's grid (serving reaches it)
    contexts = [32, 256, 1024, 2048, 4096, 16384]
    chunks = [16, 64, 256, 1024, 2048, 4096, 8192]
    cached = [0, 512, 4096, 16384]
    if quick:
        graph_sizes, contexts, chunks, cached = graph_sizes[::3], contexts[::2], chunks[::2], cached[::2]

    # Every sequence of a point within --max-model-len: the engine's block tables hold no more, and a point past it
    # failed each of its steps (a traceback each) while its times went into the profile, at exit 0.
    def decode_fits(ctx: int) -> bool:  # room for the tokens its timed steps add
        return ctx + 16 <= max_model_len

    def prefill_fits(c: int, q: int) -> bool:
        return c + q + 2 <= max_model_len

    points: list[GridPoint] = []
    for bs, ctx in itertools.product(graph_sizes, contexts):
        if bs * (ctx + 16) <= max_kv_tokens and decode_fits(ctx):
            points.append(GridPoint("decode", decode=(bs, ctx)))
    # Every row sampling (with temperature; with top-k and top-p) beside the greedy point of the same batch: the
    # difference is what sampling adds to a step (sim.replay --temperature, --top-k, --top-p).
    beside = sorted(bs for bs, ctx in (point.decode for point in points) if ctx == SAMPLING_CONTEXT)
    sampled_sizes = sorted({beside[0], beside[-1]}) if quick and beside else \
        [bs for bs in beside if bs in SAMPLING_BATCH_SIZES]
    for bs, mode in itertools.product(sampled_sizes, ("temperature", "filters")):
        points.append(GridPoint("decode", decode=(bs, SAMPLING_CONTEXT), sampling=mode))
    for q, c in itertools.product(chunks, cached):
        if q <= budget and prefill_fits(c, q):
            points.append(GridPoint("prefill", prefill=((c, q),)))
    for n, q in ((2, 1024), (4, 512), (8, 256), (16, 128), (4, 2048), (32, 64), (3, 1500)):
        if n * q <= budget and prefill_fits(0, q):
            points.append(GridPoint("multi_prefill", prefill=tuple((0, q) for _ in range(n))))
    # A full batch too (max_num_seqs - 1 decode rows beside the chunk): decode-heavy serving near saturation runs
    # its mixed steps there, beyond 192 rows.
    mixed_sizes = sorted({b for b in (8, 32, 96, 192, max_num_seqs - 1) if b >= 1})
    for bs, ctx, q, c in itertools.product(mixed_sizes, (512, 4096), (64, 1024, 4096), (0, 2048)):
        fits_len = decode_fits(ctx) and prefill_fits(c, q)
        if fits_len and bs + q <= budget and bs + 1 <= max_num_seqs and bs * (ctx + 16) + c + q <= max_kv_tokens:
            points.append(GridPoint("mixed", decode=(bs, ctx), prefill=((c, q),)))
    # Serving batches mix short and long contexts: one long sequence among short ones.
    for bs, ctx, long_ctx in itertools.product((32, 96, 192, 256), (256, 1024), (4096, 16384)):
        if bs <= max_num_seqs and decode_fits(long_ctx) and bs * (ctx + 16) + long_ctx <= max_kv_tokens:
            points.append(GridPoint("decode_skewed", decode=(bs - 1, ctx), long_decode=(1, long_ctx)))
    # The decode step right after an eager one (the prefilled sequence joins the batch): serving alternates them.
    for bs, ctx, q in itertools.product((8, 64, 192), (512, 2048), (256, 2048)):
        fits_len = decode_fits(ctx) and prefill_fits(0, q)
        if fits_len and bs + 1 <= max_num_seqs and bs + q <= budget and bs * (ctx + 16) + q <= max_kv_tokens:
            points.append(GridPoint("decode_after_eager", decode=(bs, ctx), prefill=((0, q),)))
    return points


def blocks_needed(point: GridPoint, block_size: int) -> int:
    """The KV blocks a grid point's sequences hold at once, each a whole number of blocks (what StateInjector.add
    allocates, with room for the tokens the timed steps add, and for ``row_context``'s shift of a decode row)."""
    bs, ctx = point.decode
    num_long, long_ctx = point.long_decode
    return (bs * cdiv(ctx + block_size + 16, block_size) + num_long * cdiv(long_ctx + block_size + 16, block_size)
            + sum(cdiv(c + q + 2, block_size) for c, q in point.prefill))


def row_context(ctx: int, block_size: int, num_steps: int) -> int:
    """The context to give a decode row of a grid point meant to hold ``ctx`` tokens, so that none of the
    ``num_steps`` steps it then takes opens a KV block or fills one (``ctx`` itself where it already is so, or where a
    block is too small to hold the steps; else shifted up, by 2 tokens for a context that is a multiple of the block
    size). A serving batch's rows sit anywhere in their last block, and a step finds about one row in block_size at a
    boundary; grid contexts are round numbers, mostly multiples of the block size, so every row of the batch would
    reach a boundary in the same step and pay the block allocations (or prefix-cache registrations) of block_size
    steps at once, and the scheduler would check each row of that step one by one (engine.core.steady_decodes): a
    step no serving run takes, which the medians of the decode points hid in one repeat of five and the steps timed
    right after a prefill (``decode_after_eager``) measured in full (0.6-1.8 ms more at 192 rows on one H200)."""
    first = ctx - 1  # the position the row's first step computes (StateInjector.add leaves it one token to compute)
    # Positions first .. first + num_steps - 1 must avoid offset 0 (opens a block) and block_size - 1 (fills one).
    if num_steps + 2 > block_size:
        return ctx
    offset = first % block_size
    if 1 <= offset and offset + num_steps - 1 <= block_size - 2:
        return ctx
    return ctx + (1 - offset) % block_size


class StateInjector:
    """Puts sequences straight into the scheduler's running list with their KV blocks allocated."""

    def __init__(self, engine, vocab_size: int, seed: int = 0) -> None:
        self.engine = engine
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self._next_id = 10**9

    def add(self, num_cached: int, num_new: int, max_tokens: int, sampling: str = "greedy") -> Sequence:
        scheduler = self.engine.scheduler
        tokens = self.rng.integers(self.vocab_size, size=num_cached + num_new).tolist()  # 256 x 16k: 10x random's
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **SAMPLING_PARAMS[sampling])
        seq = Sequence(self._next_id, tokens, params)
        self._next_id += 1
        seq.max_num_tokens = min(seq.max_num_tokens, scheduler.config.max_seq_len)
        if not scheduler.block_manager.allocate(seq, [], num_cached + num_new):
            raise RuntimeError(f"grid point does not fit the KV cache ({num_cached + num_new} tokens)")
        seq.num_computed_tokens = num_cached
        seq.first_scheduled_s = 0.0
        scheduler.add_running(seq)
        return seq

    def clear(self) -> None:
        """Abort every sequence, and free them before the next point is timed. The scheduler holds on to the last
        decode batch (to tell whether the next one continues it) and to its plain-decode calendar until a step replaces
        them: the next point's first step, timed, then freed a whole batch's sequences, each with its thousands of token
        ids (the 16-token prefill timed right after the 256-row decode point: +2.6 ms on the H100, +6.8 on the H200,
        where serving frees a request or two a step). A step of the emptied engine, untimed, lets go of them here."""
        scheduler = self.engine.scheduler
        for seq in list(scheduler.running) + list(scheduler.waiting):
            scheduler.abort(seq)
        self.engine.step()


def time_step(engine) -> tuple[dict, float, int]:
    """One whole engine step (the engine's own step body), timed: the features of its batch, its time, and how many of
    its rows the scheduler handled one by one (a large serving batch's plain decode rows it does not look at)."""
    t0 = time.perf_counter()
    batch, _ = engine.step()
    elapsed_s = time.perf_counter() - t0
    if batch.special_rows is None:
        checked = len(batch.seqs)
    else:
        checked = len(batch.special_rows) + len(batch.seqs) - batch.steady_rows
    return batch_features(batch), elapsed_s, checked  # a batch's features are fixed when it is scheduled


def measure_once(engine, injector: StateInjector, point: GridPoint, decode_steps: int = 1) -> tuple[dict, float, int]:
    """One timed sample of ``point``, from a state built afresh (``time_step``'s triple). A decode point's sample is
    the mean of ``decode_steps`` steps in a row (its features those of the first): a serving batch's decode steps
    follow one another, and a step timed alone, after the host's work of building the state, may not be priced as
    they are (see DECODE_STEPS)."""
    # An engine that runs ahead launches a decode step during the step before when nothing can join the batch; in
    # serving a request that joins it holds that launch back (ModelRunner.arrivals_pending). Here the launches are
    # made only where a decode point times steps one after another: the untimed decode step of a mixed point would
    # launch a step its prefill then throws away (and waits for), and the point after a decode point would wait for
    # the step launched behind that point's last timed step (a full batch launches whatever arrives: a 16-token
    # prefill timed after a 256-row decode point took 15 ms, against 2.2 before run-ahead).
    runner = engine.runner
    runs_ahead = getattr(runner, "run_ahead", False)

    def launching(on: bool) -> None:
        if runs_ahead:
            runner.run_ahead = on

    launching(False)
    try:
        return _measure_once(engine, injector, point, decode_steps, launching)
    finally:
        launching(True)


def _measure_once(engine, injector: StateInjector, point: GridPoint, decode_steps: int,
                  launching) -> tuple[dict, float, int]:
    block_size = engine.scheduler.block_manager.block_size
    bs, ctx = point.decode
    if point.family in ("decode", "decode_skewed"):
        num_long, long_ctx = point.long_decode
        for _ in range(bs):  # a warm-up step, then the timed ones
            injector.add(row_context(ctx, block_size, decode_steps + 1) - 1, 1, max_tokens=decode_steps + 7,
                         sampling=point.sampling)
        for _ in range(num_long):
            injector.add(row_context(long_ctx, block_size, decode_steps + 1) - 1, 1, max_tokens=decode_steps + 7)
        launching(True)
        time_step(engine)  # untimed: it also files the rows as plain decodes (engine.core.steady_decodes)
        # Each repeats the batch before it, from the plan prepared (or the step launched) during it.
        timed = [time_step(engine) for _ in range(decode_steps - 1)]
        launching(False)  # the last launches none after it
        timed.append(time_step(engine))
        features, _, checked = timed[0]
        sample = (features, sum(t for _, t, _ in timed) / decode_steps, checked)
    else:
        after_eager = point.family == "decode_after_eager"
        for _ in range(bs):  # a decode step, then the timed step (and the decode step after a prefill, timed)
            injector.add(row_context(ctx, block_size, 3 if after_eager else 2) - 1, 1, max_tokens=8)
        if bs:
            # Untimed: the decode rows take one step, as a serving batch's rows have when a request joins it; the
            # scheduler then knows them for plain decodes and, in a large batch, checks only the joining row.
            time_step(engine)
        for c, q in point.prefill:
            injector.add(c, q, max_tokens=8)
        if after_eager:
            time_step(engine)  # the eager step, untimed; the decode step after it is the sample
        sample = time_step(engine)
    injector.clear()
    return sample


def measure_grid(engine, injector: StateInjector, grid: list[GridPoint], repeats: int, progress=None,
                 decode_steps: int = 1) -> list[dict]:
    """Every grid point's ``repeats`` timed steps, taken in passes over the whole grid (one step of each point a
    pass) after one pass that warms every shape up (graphs, kernels, allocations) and is not kept. The host's speed
    drifts and has slow episodes of seconds (sim.host_episodes): timed back to back, a point's repeats could all fall
    in one (two profiles of one machine, minutes apart, differed by up to 70 % at single points, by a few % overall);
    spread over the passes, each point's median sees the same mix of the host's states as every other point's."""
    samples: list[list[tuple[dict, float, int]]] = [[] for _ in grid]
    for rep in range(repeats + 1):
        for kept, point in zip(samples, grid):
            sample = measure_once(engine, injector, point, decode_steps)
            if rep:
                kept.append(sample)
        if progress is not None:
            progress(rep, repeats)
    return [_point_record(point, kept) for point, kept in zip(grid, samples)]


def _point_record(point: GridPoint, samples: list[tuple[dict, float, int]]) -> dict:
    times = [t for _, t, _ in samples]
    features, _, checked_rows = samples[len(samples) // 2]  # a point's features are the same at every repeat
    return {
        "family": point.family,
        **({"sampling": point.sampling} if point.sampling != "greedy" else {}),
        "decode": list(point.decode),
        "prefill": [list(p) for p in point.prefill],
        "long_decode": list(point.long_decode),
        "features": features,
        "times_s": times,
        "median_s": statistics.median(times),
        "checked_rows": checked_rows,
    }


def with_greedy_twins(sampling_points: list[dict], points: list[dict]) -> list[dict]:
    """Each sampled point with ``greedy_median_s``: the median of the greedy 'decode' point of its batch and context,
    measured in the same passes over the grid (what the sampled step took beyond it is sampling's cost)."""
    greedy = {tuple(p["decode"]): p["median_s"] for p in points if p["family"] == "decode"}
    return [{**p, "greedy_median_s": greedy[tuple(p["decode"])]} for p in sampling_points]


def _add_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace, sampling_points: list[dict],
                  started: float) -> int:
    """--sampling-only: the sampled points (and the sampling fit) written into the existing profile --out, whose
    other points and calibration are kept: what sampling adds is measured beside a greedy step of the same session,
    so a profile measured before sampled points existed gains them in minutes, not a whole grid's measurement."""
    from sim.profiled_cost_model import fit_sampling, read_profile, write_profile

    out = Path(args.out)
    try:
        profile = read_profile(out)
        profile["sampling_points"] = sampling_points
        profile["fit"]["sampling"] = fit_sampling(sampling_points)
        profile["sampling_measured_at"] = time.strftime("%Y-%m-%d")
        # The sampled points and their greedy twins may be timed over more steps in a row than the grid was
        # (--decode-steps): their differences are what the fit keeps, each pair timed alike.
        profile["sampling_decode_steps_per_sample"] = args.decode_steps
        write_profile(out, profile)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    modes = ", ".join(f"{mode} at {table['batch_sizes']} rows" for mode, table in profile["fit"]["sampling"].items())
    with outputs_in_place(f"{escape_controls(out)} is updated"):  # a Ctrl-C now says so
        print(f"{len(sampling_points)} sampled points in {time.perf_counter() - started:.0f} s, written into {out}: "
              f"{modes}")
    return 0


# The engine options a profile is measured at, as the engine's config defines them (defaults, help, checks).
ENGINE_OPTIONS = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "block_size",
                  "allow_long_max_model_len", "device", "overlap_decode_attention")
# The longest sequence of the grid unless --max-model-len says otherwise, as the shipped profiles were measured; a model
# of a shorter context gets its own (the fixed 32768 default was refused for it, naming an option sim.profile lacked).
PROFILE_MAX_MODEL_LEN = 32768
MAX_REPEATS = 10_000  # timed steps per grid point: 2**70 measured the first point forever
# Decode steps in a row behind each sample of a decode point; row_context keeps them all inside their KV blocks. One
# (a step timed alone) stays the default: four in a row, alternated with one on a machine start (2026-12-03,
# validation/results/machine-j-2026-12-03/profile-diffs.txt), moved the decode points 0 to -2 % against the prefill
# and mixed points it does not touch, no more at small batches than at large ones, while the host's drift between
# profiles moved everything 3-8 %. Small serving batches' decode steps are faster than a grid of another machine prices
# them; that is the machine, not a step timed alone.
DECODE_STEPS = 1
MAX_DECODE_STEPS = 8


def _check_profile_to_extend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--sampling-only: --out must be a readable profile measured for --model, --gpu and --tensor-parallel-size."""
    from engine.core.model_config import ModelShape, resolve_model_dir
    from sim.profiled_cost_model import read_profile

    try:
        profile = read_profile(Path(args.out))
        name = ModelShape.load(resolve_model_dir(args.model)).name
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: --out (with --sampling-only, the profile to add to): {exc}\n")
    measured = (Path(profile["model"]).name.lower(), profile["gpu"].lower(), profile["tensor_parallel_size"])
    asked = (name.lower(), args.gpu.lower(), args.tensor_parallel_size)
    if measured != asked:
        parser.exit(2, f"error: --out {args.out} was measured for {measured[0]} on {measured[1]} at tensor-parallel "
                       f"size {measured[2]}, not {asked[0]} on {asked[1]} at {asked[2]}; --sampling-only adds to a "
                       "profile of the deployment it measures\n")
    # What sampling adds is priced in seconds: the CPU's (--device cpu) or another GPU's written into an H200 profile
    # priced every sampled step of its replays with that device's times.
    device, recorded = measuring_device(args.device), profile.get("device")
    if device is not None and isinstance(recorded, str) and device != recorded:
        parser.exit(2, f"error: --out {args.out} was measured on {recorded}, and --device {args.device} measures on "
                       f"{device}; --sampling-only adds points measured on the profile's own device\n")


def measuring_device(device: str) -> str | None:
    """The name a profile records for what ``--device`` measures: 'cpu', or the CUDA device's own name; None where
    torch sees no such CUDA device (the command refuses that itself)."""
    import torch

    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        return None
    index = 0 if device in ("auto", "cuda") else int(device.split(":")[1])
    return torch.cuda.get_device_name(index) if index < torch.cuda.device_count() else None


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad options (exit 2, one line naming the option) before anything is loaded or measured."""
    from engine.core.model_config import ModelShape, resolve_model_dir
    from sim.files import check_output_path
    from sim.hardware import GPUS

    if not 1 <= args.decode_steps <= MAX_DECODE_STEPS:
        parser.exit(2, f"error: --decode-steps must be an integer from 1 to {MAX_DECODE_STEPS}, "
                       f"got {args.decode_steps}\n")
    if not 1 <= args.repeats <= MAX_REPEATS:
        parser.exit(2, f"error: --repeats must be an integer from 1 to {MAX_REPEATS:,}, got {args.repeats}\n")
    if not args.gpu.strip():
        parser.exit(2, "error: --gpu is empty; expected the GPU's name (e.g. h200), matched by sim.replay --gpu\n")
    if args.gpu.lower() not in GPUS:  # sim.replay --gpu accepts only these: a profile under another name is never used
        parser.exit(2, f"error: --gpu {args.gpu}: unknown GPU; sim.replay --gpu knows {', '.join(GPUS)}\n")
    try:
        model_dir = resolve_model_dir(args.model)
        shape = ModelShape.load(model_dir)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"error: --model {args.model}: {exc}\n")
    if args.sampling_only:  # the profile to add the sampled points to, of this deployment
        _check_profile_to_extend(parser, args)
    else:
        # As typed: a trailing '/' is a folder. The model's config.json is an input: --out onto it with --overwrite
        # replaced the model's shape with the profile after the whole measurement.
        problem = check_output_path(args.out, "--out", [model_dir / "config.json"], overwrite=args.overwrite)
        if problem:
            parser.exit(2, f"error: {problem}\n")
    names = (*ENGINE_OPTIONS, "max_model_len")
    if args.max_model_len is None:
        args.max_model_len = min(PROFILE_MAX_MODEL_LEN, shape.max_position_embeddings)
    try:
        options = EngineOptions.from_kwargs(args.model, load_format="dummy", **{n: getattr(args, n) for n in names})
        options.check_model(shape)
    except ValueError as exc:
        field = getattr(exc, "field", None)
        flag = f"--{field.replace('_', '-')}: " if field in names else ""
        parser.exit(2, f"error: {flag}{exc}\n")
    import torch

    if args.device != "cpu" and not torch.cuda.is_available():  # auto would measure the CPU for minutes, then fail
        parser.exit(2, f"error: --device {args.device}: sim.profile measures GPU step times and torch sees no CUDA "
                       "device; run it on the GPU (--device cpu measures the CPU, for tests only)\n")


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m sim.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="shipped model config or model dir (dummy weights)")
    parser.add_argument("--gpu", default="h200", help="name stored in the profile, matched by sim.replay --gpu")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists (a shipped profile, say)")
    add_config_arguments(parser, EngineOptions, ENGINE_OPTIONS)  # the engine's own defaults, as every replay has them
    parser.add_argument("--max-model-len", type=int, default=None,
                        help=f"longest prompt+output in tokens (default: the model's, at most {PROFILE_MAX_MODEL_LEN})")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed steps per grid point, one in each pass over the grid")
    parser.add_argument("--decode-steps", type=int, default=DECODE_STEPS,
                        help="decode steps in a row timed for each sample of a decode point (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a coarse grid (for smoke tests)")
    parser.add_argument("--sampling-only", action="store_true",
                        help="measure only the sampled decode points (and the greedy ones beside them) and write them "
                             "into the existing profile --out, keeping its other points and calibration")
    args = parser.parse_args(argv)
    _check_args(parser, args)  # every bad option fails here, before the model loads and the grid is measured

    import torch

    from engine.llm import LLM
    from sim.profiled_cost_model import describe_held_out, fit_profile, write_profile

    started = time.perf_counter()
    llm = LLM(
        args.model, load_format="dummy", max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size, device=args.device,
        allow_long_max_model_len=args.allow_long_max_model_len, overlap_decode_attention=args.overlap_decode_attention,
    )
    engine = llm.engine
    max_kv_tokens = engine.config.kv_capacity_tokens // 2
    grid = build_grid(args.max_num_seqs, args.max_num_batched_tokens, engine.config.max_model_len, max_kv_tokens,
                      args.quick, args.sampling_only)
    block_size, num_blocks = engine.config.block_size, engine.config.num_gpu_blocks
    if not grid:
        llm.close()
        parser.exit(2, f"error: --max-model-len {engine.config.max_model_len}: no grid point fits within it; "
                       "expected room for at least the shortest prefill chunk and its output\n")
    fitting = [point for point in grid if blocks_needed(point, block_size) <= num_blocks]
    if len(fitting) < len(grid):  # each sequence holds whole blocks: a small cache holds fewer than its tokens
        print(f"  {len(grid) - len(fitting)} of {len(grid)} grid points need more than the KV cache's {num_blocks} "
              f"blocks of {block_size} tokens; measuring the other {len(fitting)}", file=sys.stderr)
    if not fitting:
        llm.close()
        parser.exit(2, f"error: no grid point fits the KV cache ({num_blocks} blocks of {block_size} tokens); "
                       "lower --block-size or --max-num-seqs, or measure on a GPU with more memory\n")
    grid = fitting
    injector = StateInjector(engine, llm.shape.vocab_size)

    def progress(rep: int, repeats: int) -> None:
        what = "warm-up pass" if rep == 0 else f"pass {rep}/{repeats}"
        print(f"  {what} over {len(grid)} grid points, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    measured = measure_grid(engine, injector, grid, args.repeats, progress, args.decode_steps)
    # The sampled points apart: every reader of 'points' (the fit, sim.limits' range, sim.bands' noise) takes greedy
    # steps, as the grid's other points and the simulator's default replays are; fit_profile prices sampling from them,
    # each against the greedy point of its shape measured in the same passes.
    points = [p for p in measured if "sampling" not in p]
    sampling_points = with_greedy_twins([p for p in measured if "sampling" in p], points)
    # What the runner captured, read before close() releases it.
    graph_sizes = list(getattr(llm.runner, "_graph_sizes", []))
    piecewise_sizes = list(llm.runner.piecewise.sizes) if llm.runner.piecewise is not None else []
    # Decode steps that continue the step before's batch run from a plan prepared during that step (the
    # runner's NextDecode): the 'decode' family measures those, 'decode_after_eager' the others.
    prepares_decode_ahead = bool(getattr(llm.runner, "prepare_ahead", False))
    # ... or, with run-ahead, launched during that step: the 'decode' family then times those (none waits).
    runs_decode_ahead = bool(getattr(llm.runner, "run_ahead", False))
    # Mixed steps whose decode attention ran beside their prefill attention (TritonBackend.overlap_decode).
    overlaps_decode_attention = bool(getattr(llm.runner.backend, "overlap_decode", False))
    llm.close()
    if args.sampling_only:
        return _add_sampling(parser, args, sampling_points, started)
    profile = {
        "model": llm.shape.name if args.model.count("/") == 0 else args.model,
        "gpu": args.gpu,
        "tensor_parallel_size": args.tensor_parallel_size,
        "device": measuring_device(args.device),  # --device cpu on a GPU host was recorded as the GPU
        "torch": torch.__version__,
        "host": host_info(),
        "measured_at": time.strftime("%Y-%m-%d"),
        "engine_features": {"prepares_decode_ahead": prepares_decode_ahead, "runs_decode_ahead": runs_decode_ahead,
                            "overlaps_decode_attention": overlaps_decode_attention, "sampler": "gumbel one pass"},
        "decode_steps_per_sample": args.decode_steps,
        "engine_options": {
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "block_size": args.block_size, "max_model_len": args.max_model_len,
            "num_gpu_blocks": engine.config.num_gpu_blocks,
            "cuda_graph_sizes": graph_sizes,
            "piecewise_graph_sizes": piecewise_sizes,
        },
        "points": points,
        "sampling_points": sampling_points,
        "sampling_decode_steps_per_sample": args.decode_steps,
        "profile_wall_s": round(time.perf_counter() - started, 1),
    }
    profile["fit"] = fit_profile(profile)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(out, profile)
    held = profile["fit"]["held_out"]
    with outputs_in_place(f"{escape_controls(out)} is complete"):  # a Ctrl-C now says it is whole
        print(f"{len(points)} grid points in {profile['profile_wall_s']} s; {describe_held_out(held)}")
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
