"""A cost model fitted to step times measured on the real engine (``python -m sim.profile``).

Two regimes, as the engine runs them:
- decode-only steps replay a CUDA graph padded to a batch-size bucket: time = a(bucket) + b(bucket) x
  (KV tokens read), with a and b fitted per measured bucket size and interpolated between them. An engine
  that plans the next decode step while the current one runs (its profile's ``engine_features``) does so
  only for a step that repeats the batch before it (``continues_batch``); the others pay their planning:
  a surcharge c + d x (batch size), fitted on the grid's decode steps right after a prefill. An engine that runs
  ahead (``engine_features.runs_decode_ahead``: it launches such a step during the step before) was timed so on
  the grid's decode points, and the simulator marks the steps it launches so ``ran_ahead`` in its step log (where
  no request can be admitted next; a step that repeats its batch is priced so either way);
- every other step (prefill or mixed) is a host part and a device part, each linear with non-negative
  coefficients. An engine that replays prefill and mixed steps as piecewise CUDA graphs (profiles
  that list ``piecewise_graph_sizes``) launches a step in ~2 ms whatever its size, and keeps the GPU
  busy: its step time is the host's serial work (planning, input copies, sampling, postprocess) *plus*
  the device time, the matmuls priced on the tokens padded to the graph bucket (form "sum"). An
  engine that launched those steps eagerly from Python (older profiles) took the *larger* of a
  host-bound floor and the device time (form "max").
Every fourth grid point of each family is held out of a first fit and its error is reported; the model
then is fitted on every point. A profile calibrated on serving runs (``python -m sim.calibrate``)
scales the host part and decode steps by its measured factors; ``host_slowdown`` replaces the average
by a given host speed.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from operator import mul
from pathlib import Path

import numpy as np

from engine.core.json_errors import json_type_name
from engine.core.messages import shown
from engine.core.scheduler import ScheduledBatch
from sim.batch_features import batch_features, is_count
from sim.files import read_json_input, write_text_atomic

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
FLOOR_BASIS = ("one", "num_seqs", "num_prefill_seqs", "has_decode_rows")
GPU_BASIS = ("one", "tokens", "attention_pairs", "kv_tokens_read")


SUM_FLOOR_BASIS = ("one", "num_seqs", "extra_prefill_seqs", "has_decode_rows")
SUM_GPU_BASIS = ("padded_tokens", "attention_pairs", "decode_kv_tokens", "prefill_kv_tokens")
# A fit's optional fifth device feature: the padded tokens beyond a knot (the fit's 'tokens_knot'), for matmuls whose
# time per token grows with the step. qwen3-8b's grid took 22.7, 22.3, 24.1 and 27.3 us a token at 1k, 2k, 4k and 8k
# tokens (one prompt each) and 23.8 at 4 x 2k: the four-term line priced its 1k steps 5-10 % long and its 8k ones 7 %
# short, and the GPU runs' prefills of 3k+ tokens 5-8 % short on both its Azure slices. A hinge, not a square: beyond
# the grid's largest step it grows at the last slope measured, not ever faster.
TOKENS_BEYOND_KNOT = "padded_tokens_beyond_knot"
# Knots tried: the piecewise graph sizes from this one to below the largest. The one with the smallest training error
# is kept where its hinge coefficient is above 0 and it removes at least MIN_KNOT_GAIN of the line's squared error
# (qwen3-8b's grid: 74 %; qwen3-0.6b's: under 1 %, a line kept, which an extra term would only bend to the noise).
MIN_TOKENS_KNOT = 512
MIN_KNOT_GAIN = 0.1


def _sum_floor_row(f: dict) -> list[float]:
    """Host work of a piecewise-graph step (and its fixed device work, which the constant absorbs): per step,
    per sequence, per prefill chunk past the first, and the decode attention's own launches."""
    return [1.0, f["num_seqs"], max(0, f["num_prefill_seqs"] - 1), 1.0 if f["num_decode_seqs"] else 0.0]


def _sum_gpu_row(f: dict, sizes: list[int], knot: int = 0) -> list[float]:
    """Device time: matmuls over the tokens padded to the step's graph bucket, prefill attention pairs, KV
    tokens read by decode rows and by prefill chunks (their cached prefix and themselves); with a ``knot``, also
    the padded tokens beyond it (TOKENS_BEYOND_KNOT)."""
    tokens = f["num_prefill_tokens"] + f["num_decode_seqs"]
    if sizes and tokens <= sizes[-1]:
        tokens = sizes[bisect.bisect_left(sizes, tokens)]
    row = [tokens, f["prefill_attention_pairs"], f["decode_context_tokens"],
           f["prefill_context_tokens"] + f["num_prefill_tokens"]]
    if knot:
        row.append(max(tokens - knot, 0))
    return row


def _dot(coefficients: list[float], row: list) -> float:
    """The dot product of an eager step's row (a few features), its products summed left to right from 0.0: the
    float ``np.dot`` gave where OpenBLAS sums so few terms without fused multiply-adds (as on the machines whose runs
    the shipped figures came from), without np.dot's conversion of the list: ~3,400 instructions instead of ~10,000 at
    every prefill or mixed step (-0.9 % of the 64-replica benchmark's instructions, -1.1 % of the Azure trace's first
    5,000 requests), and no longer dependent on the BLAS build."""
    return float(sum(map(mul, coefficients, row)))


def _floor_row(f: dict) -> list[float]:
    """Host-bound floor of an eager step: launching every kernel of every layer, plus per-sequence input work;
    a step with decode rows beside its prefill also launches every layer's decode attention (and its merge)."""
    return [1.0, f["num_seqs"], f["num_prefill_seqs"], 1.0 if f["num_decode_seqs"] else 0.0]


def _gpu_row(f: dict) -> list[float]:
    """Device-bound time: matmuls over the step's tokens, prefill attention, KV bytes read."""
    tokens = f["num_prefill_tokens"] + f["num_decode_seqs"]
    kv = f["prefill_context_tokens"] + f["num_prefill_tokens"] + f["decode_context_tokens"]
    return [1.0, tokens, f["prefill_attention_pairs"], kv]


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (drop the most negative column until none is)."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    if x.shape[0] == 0:
        # No points to fit on (the eager max form's regime holding none of a grid's one or two eager points): every
        # coefficient 0. Each such grid was refused with numpy's "zero-size array to reduction operation maximum
        # which has no identity", which said nothing of the profile.
        return coef
    while active:
        scale = np.maximum(np.abs(x[:, active]).max(axis=0), 1e-12)
        sol, *_ = np.linalg.lstsq(x[:, active] / scale, y, rcond=None)
        sol = sol / scale
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def _is_graph_step(f: dict, max_graph_bs: int) -> bool:
    return f["num_prefill_tokens"] == 0 and 0 < f["num_decode_seqs"] <= max_graph_bs


def _fit_decode(points: list[dict]) -> dict:
    by_bs: dict[int, list[tuple[float, float]]] = {}
    for p in points:
        f = p["features"]
        by_bs.setdefault(f["num_decode_seqs"], []).append((f["decode_context_tokens"], p["median_s"]))
    slopes = []
    fits = {}
    for bs, pairs in sorted(by_bs.items()):
        x = np.array([c for c, _ in pairs], dtype=float)
        y = np.array([t for _, t in pairs], dtype=float)
        if len(pairs) >= 2 and np.ptp(x) > 0:
            b, a = np.polyfit(x, y, 1)
            b = max(b, 0.0)
            a = float(np.mean(y - b * x))
            if a < 0:
                # Times that grow faster than in proportion to the context (a short context's step measured as
                # fast as nothing) gave a negative intercept: sim.fit_profile wrote it at exit 0, and every replay
                # then refused the profile ('fit.graph_decode.intercept_s ... expected >= 0'). The line through
                # the origin instead: the non-negative least-squares fit of a + b x once a is held at 0.
                a, b = 0.0, max(float(x @ y / (x @ x)), 0.0)
            slopes.append(b)
        else:
            a, b = float(y.mean()), None
        fits[bs] = [a, b]
    default_slope = float(np.median(slopes)) if slopes else 0.0
    batch_sizes = sorted(fits)
    return {
        "batch_sizes": batch_sizes,
        "intercept_s": [fits[b][0] for b in batch_sizes],
        "per_kv_token_s": [fits[b][1] if fits[b][1] is not None else default_slope for b in batch_sizes],
    }


def _fit_eager(points: list[dict], iterations: int = 8) -> dict:
    """t = max(floor, gpu): each point is assigned to the regime that predicts it larger, each regime is refit
    on its points (non-negative, relative error), and so on until the assignment settles."""
    floor_x = np.array([_floor_row(p["features"]) for p in points], dtype=float)
    gpu_x = np.array([_gpu_row(p["features"]) for p in points], dtype=float)
    y = np.array([p["median_s"] for p in points], dtype=float)
    w = 1.0 / y  # relative error: short steps count as much as long ones
    small = gpu_x[:, 1] <= np.quantile(gpu_x[:, 1], 0.5)
    floor_coef = _nonnegative_lstsq(floor_x[small] * w[small, None], y[small] * w[small])
    gpu_coef = _nonnegative_lstsq(gpu_x[~small] * w[~small, None], y[~small] * w[~small])
    for _ in range(iterations):
        on_gpu = gpu_x @ gpu_coef > floor_x @ floor_coef
        if on_gpu.sum() >= gpu_x.shape[1]:
            gpu_coef = _nonnegative_lstsq(gpu_x[on_gpu] * w[on_gpu, None], y[on_gpu] * w[on_gpu])
        if (~on_gpu).sum() >= floor_x.shape[1]:
            floor_coef = _nonnegative_lstsq(floor_x[~on_gpu] * w[~on_gpu, None], y[~on_gpu] * w[~on_gpu])
    return {"form": "max", "floor_basis": list(FLOOR_BASIS), "floor_coef": floor_coef.tolist(),
            "gpu_basis": list(GPU_BASIS), "gpu_coef": gpu_coef.tolist()}


def _fit_sum(points: list[dict], sizes: list[int]) -> dict:
    """t = host + gpu, one non-negative least-squares fit in relative error over both parts' features; with the
    tokens-beyond-a-knot term where one of the knots tried fits the points clearly better (MIN_TOKENS_KNOT,
    MIN_KNOT_GAIN)."""
    floor_x = np.array([_sum_floor_row(p["features"]) for p in points], dtype=float)
    y = np.array([p["median_s"] for p in points], dtype=float)
    n = floor_x.shape[1]
    fits = []  # (squared relative error, knot, coefficients); knot 0: the line
    for knot in [0, *(s for s in sizes[:-1] if s >= MIN_TOKENS_KNOT)]:
        gpu_x = np.array([_sum_gpu_row(p["features"], sizes, knot) for p in points], dtype=float)
        x = np.hstack([floor_x, gpu_x]) / y[:, None]
        coef = _nonnegative_lstsq(x, np.ones_like(y))
        if knot == 0 or coef[-1] > 0:  # a hinge held at 0 is the line again
            fits.append((float(((x @ coef - 1.0) ** 2).sum()), knot, coef))
    best = min(fits, key=lambda fit: fit[0])
    line_error = fits[0][0]
    # (A line that fits to within rounding, relative errors ~1e-15, is kept whatever a hinge's rounding says.)
    if best[0] > (1.0 - MIN_KNOT_GAIN) * line_error or line_error <= 1e-20 * len(y):
        best = fits[0]
    _, knot, coef = best
    fit = {"form": "sum", "floor_basis": list(SUM_FLOOR_BASIS), "floor_coef": coef[:n].tolist(),
           "gpu_basis": list(SUM_GPU_BASIS), "gpu_coef": coef[n:].tolist(), "piecewise_graph_sizes": sizes}
    if knot:
        fit["gpu_basis"].append(TOKENS_BEYOND_KNOT)
        fit["tokens_knot"] = knot
    return fit


def _excess_context(num_seqs: int, context_tokens, longest):
    """How far the longest decode context exceeds the mean one (``num_seqs`` > 0): the extra time of the program
    that reads it. Written with operators only, so the contexts may be arrays (a quiet decode run, one entry per
    step) and give the very floats they give one by one."""
    excess = longest - context_tokens / num_seqs
    return excess * (excess > 0)  # max(0, excess); a negative one gives -0.0, which adds as 0.0


def _decode_model(decode: dict, graph_sizes: list[int]) -> ProfiledCostModel:
    """A model of the decode fit so far alone (no eager part, no serving factors), whose misses the next term fits."""
    eager = {"floor_coef": [0.0] * len(FLOOR_BASIS), "gpu_coef": [0.0] * len(GPU_BASIS)}
    return ProfiledCostModel({"graph_decode": decode, "graph_sizes": graph_sizes,
                              "max_graph_batch_size": max(graph_sizes), "eager": eager}, "fit")


def _fit_skew(points: list[dict], decode: dict, graph_sizes: list[int]) -> float:
    """Seconds per token of excess context, least squares through the origin on the equal-context model's misses."""
    if not points:
        return 0.0
    model = _decode_model(decode, graph_sizes)
    features = [p["features"] for p in points]  # graph decode steps: at least one sequence each
    x = np.array([_excess_context(f["num_decode_seqs"], f["decode_context_tokens"],
                                  f.get("max_decode_context_tokens", 0)) for f in features])
    y = np.array([p["median_s"] - model.predict(p["features"]) for p in points])
    return max(0.0, float(x @ y / (x @ x))) if (x @ x) > 0 else 0.0


def _fit_unprepared(points: list[dict], decode: dict, graph_sizes: list[int]) -> list[float]:
    """[c, d] of the planning surcharge c + d x (batch size) of a decode step that does not repeat the batch before
    it: non-negative least squares on the steady model's misses at the grid's decode steps after a prefill."""
    if not points:
        return [0.0, 0.0]
    model = _decode_model(decode, graph_sizes)
    x = np.array([[1.0, p["features"]["num_decode_seqs"]] for p in points])
    y = np.array([p["median_s"] - model.predict({**p["features"], "continues_batch": 1}) for p in points])
    return [float(v) for v in _nonnegative_lstsq(x, y)]


# How a replay's requests sample (SimConfig.sampling_mode), beyond the greedy argmax every grid point and serving run of
# the default replays take: with temperature alone, or with top-k / top-p filters as well. sim.profile times decode
# steps whose every row samples so ('sampling_points'), each beside the greedy point of the same batch.
SAMPLING_MODES = ("temperature", "filters")


def sampled_rows(batch: ScheduledBatch) -> int:
    """The rows of ``batch`` that sample a token, as the engine's runner picks them (ModelRunner.plan's sample_rows):
    those whose new tokens end their sequence's tokens. A prefill chunk that leaves its prompt unfinished samples
    nothing, nor does a prompt's chunk of one token (the budget's last) that leaves it so, though it runs as a decode
    row; every row was charged the sampler's cost: a 5,000-token prompt's first two 2,048-token chunks, which sample
    nothing, took sampling_s(1) each (0.4 ms with top-k on the H200's shape). A decode-only step's rows are taken to
    sample without reading them, as the graph decode steps and quiet windows price them (a one-token chunk there is
    rare: its budget is all but one token decodes)."""
    if not batch.num_prefill_seqs:
        return batch.num_seqs
    # Lazy decode rows owe their tokens and their count alike (engine.core.steady_decodes): the test holds for them.
    return sum(1 for seq, num_new in zip(batch.seqs, batch.num_new_tokens)
               if seq.num_computed_tokens + num_new == seq.num_tokens)


def fit_sampling(sampling_points: list[dict]) -> dict:
    """{mode: {"batch_sizes", "extra_s"}}: the time each sampled decode point took beyond the greedy point of its
    batch and context measured in the same passes (its ``greedy_median_s``; 0 where noise put it below), per batch
    size measured."""
    fits: dict[str, dict] = {}
    for mode in SAMPLING_MODES:
        extra_by_bs = {p["decode"][0]: max(0.0, p["median_s"] - p["greedy_median_s"])
                       for p in sampling_points if p["sampling"] == mode}
        if extra_by_bs:
            sizes = sorted(extra_by_bs)
            fits[mode] = {"batch_sizes": sizes, "extra_s": [extra_by_bs[b] for b in sizes]}
    return fits


def _fit(points: list[dict], max_graph_bs: int, graph_sizes: list[int], piecewise_sizes: list[int],
         prepares_decode_ahead: bool = False) -> dict:
    graph = [p for p in points if _is_graph_step(p["features"], max_graph_bs)]
    equal = [p for p in graph if p["family"] == "decode"]  # equal contexts, steady state
    decode = _fit_decode(equal)
    skewed = [p for p in graph if p["family"] == "decode_skewed"]
    decode["per_excess_context_token_s"] = _fit_skew(skewed, decode, graph_sizes)
    # Small batches split every context widely (engine DecodeSplits): the excess costs nothing measurable there.
    decode["skew_min_batch_size"] = min((p["features"]["num_decode_seqs"] for p in skewed), default=0)
    # Without planning ahead every decode step plans itself: the steady points already carry that cost.
    after_prefill = [p for p in graph if p["family"] == "decode_after_eager"] if prepares_decode_ahead else []
    decode["unprepared_s"] = _fit_unprepared(after_prefill, decode, graph_sizes)
    eager = [p for p in points if not _is_graph_step(p["features"], max_graph_bs)]
    eager_fit = _fit_sum(eager, piecewise_sizes) if piecewise_sizes else _fit_eager(eager)
    return {"graph_decode": decode, "eager": eager_fit, "max_graph_batch_size": max_graph_bs}


_FIT_FEATURES = ("num_seqs", "num_prefill_seqs", "num_prefill_tokens", "prefill_context_tokens", "num_decode_seqs",
                 "decode_context_tokens", "prefill_attention_pairs")
# Features a profile may lack (measured before they were recorded); a text or null one was a TypeError traceback in
# sim.limits' grid range, after the whole replay had run.
_OPTIONAL_FEATURES = ("num_batched_tokens", "max_decode_context_tokens", "continues_batch")


def check_profile(profile: object) -> None:
    """Raise ValueError naming the first field of a profile (``python -m sim.profile``'s JSON) that cannot be fitted:
    a malformed file must not become a traceback or NaN coefficients."""
    if not isinstance(profile, dict):
        raise ValueError(f"the top level is a JSON {json_type_name(profile)}; expected an object from sim.profile")
    # The deployment too: sim.fit_profile refitted (and rewrote) a profile with tensor_parallel_size 0 that every
    # replay then refused.
    _check_deployment(profile)
    _check_engine_options(profile)
    _check_engine_features(profile)
    points = profile.get("points")
    if not isinstance(points, list) or not points:
        raise ValueError("field 'points' is missing, empty or not a list; expected the measured grid points")
    for i, p in enumerate(points):
        where = f"points[{i}]"
        if not isinstance(p, dict) or not isinstance(p.get("family"), str) or not isinstance(p.get("features"), dict):
            raise ValueError(f"{where}: expected an object with 'family' (a string), 'features' and 'median_s'")
        median = p.get("median_s")
        if isinstance(median, bool) or not isinstance(median, (int, float)) or not 0 < median <= _MAX_COEFFICIENT:
            raise ValueError(f"{where}: 'median_s' is {median!r}; expected a finite number of seconds > 0, at most "
                             f"{_MAX_COEFFICIENT:g}")
        for name in _FIT_FEATURES:
            if not is_count(p["features"].get(name)):
                raise ValueError(f"{where}: feature {name!r} is {p['features'].get(name)!r}; expected an integer "
                                 "from 0 to 2**53")
        for name in _OPTIONAL_FEATURES:  # absent from older profiles; sim.limits reads the grid's range from them
            if name in p["features"] and not is_count(p["features"][name]):
                raise ValueError(f"{where}: feature {name!r} is {p['features'][name]!r}; expected an integer "
                                 "from 0 to 2**53")
        times = p.get("times_s")  # the timed repeats: sim.bands draws each step's noise from them
        if times is not None and (not isinstance(times, list)
                                  or not all(_is_seconds(t) and t > 0 for t in times)):
            raise ValueError(f"{where}: 'times_s' is {shown(times)}; expected a list of the repeats' times, "
                             f"finite numbers of seconds > 0, at most {_MAX_COEFFICIENT:g}")
    _check_sampling_points(profile.get("sampling_points", []))


# sim.profile's engine_features that are flags: what the profiled engine did, which the fit (run-ahead), sim.calibrate
# and analysis.compare (the engine notes) read as true or false.
ENGINE_FLAGS = ("prepares_decode_ahead", "runs_decode_ahead", "overlaps_decode_attention")


def _check_engine_features(profile: dict) -> None:
    """An object of flags and names, as sim.profile writes it, or absent (profiles measured before it). A flag of
    another type ("true", 1) was taken as off by the fit and as unknown by sim.calibrate's deployment check and by
    analysis.compare's engine notes, each without a word."""
    if "engine_features" not in profile:
        return
    features = profile["engine_features"]
    if not isinstance(features, dict):
        raise ValueError(f"field 'engine_features' is {_json_shown(features)}; expected an object of what the profiled "
                         f"engine did ({', '.join(ENGINE_FLAGS)}: true or false)")
    for name, value in features.items():
        if name in ENGINE_FLAGS and not isinstance(value, bool):
            raise ValueError(f"field 'engine_features.{name}' is {_json_shown(value)}; expected true or false")
        if not isinstance(value, (bool, str)):  # what a simulation records of it (NaN is no JSON for summary.json)
            raise ValueError(f"field 'engine_features.{shown(name)}' is {_json_shown(value)}; expected true, false "
                             "or a name")


def _json_shown(value: object) -> str:
    """A JSON value as the file spells it: the string "true" and the flag true read alike through str()."""
    return shown(json.dumps(value))


def _profiled_flag(profile: dict, flag: str) -> bool:
    """One of a profile's ENGINE_FLAGS: what its engine did, off where its features do not say (profiles measured
    before them)."""
    features = profile.get("engine_features")
    return isinstance(features, dict) and features.get(flag) is True


def _check_sampling_points(points: object) -> None:
    """sim.profile's sampled decode points (absent from profiles measured before them): what fit_profile reads."""
    if not isinstance(points, list):
        raise ValueError(f"field 'sampling_points' is {shown(points)}; expected a list of sampled decode points")
    # fit_sampling keeps one extra a mode and batch size: of two points of the same (profiles merged by hand, or two
    # contexts), the later one was taken without a word (1 ms one point, 7 ms the other: 7 ms a step).
    seen: dict[tuple[str, int], int] = {}
    for i, p in enumerate(points):
        where = f"sampling_points[{i}]"
        decode = p.get("decode") if isinstance(p, dict) else None
        if not isinstance(p, dict) or p.get("sampling") not in SAMPLING_MODES or not isinstance(decode, list) \
                or len(decode) != 2 or not all(is_count(v) for v in decode) or decode[0] < 1:
            raise ValueError(f"{where}: expected an object with 'sampling' ({' or '.join(SAMPLING_MODES)}), "
                             "'decode' [batch size >= 1, context tokens], 'median_s' and 'greedy_median_s'")
        for name in ("median_s", "greedy_median_s"):
            value = p.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_COEFFICIENT:
                raise ValueError(f"{where}: {name!r} is {value!r}; expected a finite number of seconds > 0, at most "
                                 f"{_MAX_COEFFICIENT:g}")
        key = (p["sampling"], decode[0])
        if key in seen:
            raise ValueError(f"{where}: a second {key[0]!r} point of batch size {key[1]} (also sampling_points"
                             f"[{seen[key]}]); expected one a sampling mode and batch size, as python -m sim.profile "
                             "measures them")
        seen[key] = i


def _check_deployment(profile: object) -> None:
    """Raise ValueError unless ``profile`` is an object naming the deployment it was measured on, which the
    simulator compares with the run's: a '{}' or '[]' must not surface as a KeyError or TypeError."""
    if not isinstance(profile, dict):
        raise ValueError(f"the top level is a JSON {json_type_name(profile)}; expected an object from sim.profile")
    for field in ("model", "gpu"):
        value = profile.get(field)
        if not isinstance(value, str) or not value:
            text = "missing" if field not in profile else f"{shown(value)!r}"
            raise ValueError(f"field '{field}' is {text}; expected the {field} it was measured on, a non-empty "
                             "string")
    size = profile.get("tensor_parallel_size")
    if not (is_count(size) and size >= 1):  # a string "1" was read as 1 by int()
        text = "missing" if "tensor_parallel_size" not in profile else f"{size!r}"
        raise ValueError(f"field 'tensor_parallel_size' is {text}; expected an integer >= 1")


def _check_engine_options(profile: dict) -> None:
    options = profile.get("engine_options")
    if not isinstance(options, dict):
        raise ValueError("field 'engine_options' is missing or not an object")
    for field in ("cuda_graph_sizes", "piecewise_graph_sizes"):
        sizes = options.get(field) or []
        # CUDA graph sizes are bounded as check_fit bounds the fitted max_graph_batch_size: the decode model keeps one
        # entry per batch size up to the largest graph, and cuda_graph_sizes [1, 2**40] was a MemoryError traceback in
        # sim.fit_profile and sim.calibrate (a fit every replay would have refused anyway).
        largest = _MAX_GRAPH_BATCH_SIZE if field == "cuda_graph_sizes" else 2**53  # piecewise: token counts, bisected
        if not isinstance(sizes, list) or not all(is_count(b) and 1 <= b <= largest for b in sizes) \
                or sizes != sorted(sizes):
            bounds = f"from 1 to {largest}" if field == "cuda_graph_sizes" else ">= 1"
            raise ValueError(f"field 'engine_options.{field}' is {shown(sizes)}; expected an increasing list of "
                             f"sizes {bounds}")
    for field in ("block_size", "max_num_batched_tokens", "max_num_seqs"):  # compared with the run's (sim.limits)
        value = options.get(field)
        if value is not None and not (is_count(value) and value >= 1):
            raise ValueError(f"field 'engine_options.{field}' is {value!r}; expected an integer >= 1")


# The decode model keeps one entry per batch size up to the largest graph; the engine captures at most 512.
_MAX_GRAPH_BATCH_SIZE = 2**16
# ProfiledCostModel.decode_steps_s keeps tables of prices by summed context, each of batches of up to _MAX_TABLED_ROWS
# rows and contexts of up to _MAX_PRICED_CONTEXT (1 MiB of floats: at most 16 MiB in all), for batch sizes priced
# more than _PASSES_BEFORE_TABLE times: a fleet's replicas, a few rows of up to 16,384 tokens each, are within them.
_MAX_TABLED_ROWS = 16
_MAX_PRICED_CONTEXT = 1 << 17
_PASSES_BEFORE_TABLE = 32


# No step of any engine takes a thousand seconds, nor a thousand seconds per token or sequence: a coefficient or
# serving factor beyond this is a corrupt profile, and would overflow the run's times to inf or 1e300 at the end.
_MAX_COEFFICIENT = 1e3


# Nor does serving run a thousand times faster than the grid: the fastest host --host-slowdown takes
# (sim.host_speed.MIN_SLOWDOWN, which imports this module). Factors of 1e-300 (> 0, as checked before) priced every
# decode step at 1e-303 s, and a replay of 200 ShareGPT requests on one H200 served 266,509 tokens/s at exit 0.
_MIN_FACTOR = 1e-3

# The factors sim.calibrate fits on serving runs (a session's "measured" lists those its runs measured).
SERVING_FACTORS = ("host_factor", "device_factor", "decode_factor", "repeat_decode_factor")
# A factor the runs do not measure (too few steps of its kind) prices as the grid does: a calibration replaces the
# profile's (whose factors may be another machine's), and --add averages it over the sessions that measured it only.
UNMEASURED_FACTOR = 1.0


def measured_factors(session: dict) -> set[str]:
    """The factors a calibration session measured; every one for a session calibrated before the record."""
    return set(session.get("measured", SERVING_FACTORS))


def measured_values(sessions: list[dict], name: str, value: Callable[[dict], float]) -> np.ndarray:
    """``value`` of each session that measured factor ``name``; the grid's 1 alone where none did. Averaged in, a
    session's unmeasured 1 (runs without decode steps) had moved every later simulation's price. What sim.calibrate
    --add takes a factor's mean over, and sim.bands draws each band replay's machine from."""
    return np.array([value(s) for s in sessions if name in measured_factors(s)] or [UNMEASURED_FACTOR], dtype=float)


def _is_seconds(value: object) -> bool:
    """A finite, non-negative number (a coefficient in seconds per unit) up to _MAX_COEFFICIENT: NaN, infinities,
    negatives and text would price steps at NaN or below zero, which the event loop cannot schedule."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= _MAX_COEFFICIENT


def _check_coefficients(values: object, where: str, length: int) -> None:
    if not isinstance(values, list) or len(values) != length or not all(_is_seconds(v) for v in values):
        raise ValueError(f"field '{where}' is {shown(values)}; expected a list of {length} finite numbers >= 0, "
                         f"at most {_MAX_COEFFICIENT:g} s")


def check_fit(profile: dict) -> None:
    """Raise ValueError naming the first field of a profile's fitted cost model (its 'fit', what the simulator
    prices steps with) or serving factors that would give a traceback or NaN, negative or unbounded step times."""
    fit = profile.get("fit")
    if not isinstance(fit, dict):
        raise ValueError("field 'fit' is missing or not an object; refit it with python -m sim.fit_profile")
    decode, eager = fit.get("graph_decode"), fit.get("eager")
    if not isinstance(decode, dict) or not isinstance(eager, dict):
        raise ValueError("field 'fit' has no 'graph_decode' and 'eager' objects; refit it with "
                         "python -m sim.fit_profile")
    largest = fit.get("max_graph_batch_size")
    if not is_count(largest) or largest > _MAX_GRAPH_BATCH_SIZE:
        raise ValueError(f"field 'fit.max_graph_batch_size' is {largest!r}; expected an integer from 0 to "
                         f"{_MAX_GRAPH_BATCH_SIZE}")
    sizes = decode.get("batch_sizes")
    # An engine without CUDA graphs (max_graph_batch_size 0, e.g. on a CPU) measures no graph decode steps.
    if not isinstance(sizes, list) or (largest > 0 and not sizes) or not all(is_count(b) and b >= 1 for b in sizes) \
            or sizes != sorted(set(sizes)):
        raise ValueError(f"field 'fit.graph_decode.batch_sizes' is {shown(sizes)}; expected an increasing list "
                         "of batch sizes >= 1")
    for name in ("intercept_s", "per_kv_token_s"):
        _check_coefficients(decode.get(name), f"fit.graph_decode.{name}", len(sizes))
    if "per_excess_context_token_s" in decode and not _is_seconds(decode["per_excess_context_token_s"]):
        raise ValueError(f"field 'fit.graph_decode.per_excess_context_token_s' is "
                         f"{decode['per_excess_context_token_s']!r}; expected a finite number >= 0, at most "
                         f"{_MAX_COEFFICIENT:g} s")
    skew = decode.get("skew_min_batch_size", 0)  # a batch size, not seconds
    if isinstance(skew, bool) or not isinstance(skew, int | float) or not 0 <= skew <= _MAX_GRAPH_BATCH_SIZE:
        raise ValueError(f"field 'fit.graph_decode.skew_min_batch_size' is {skew!r}; expected a batch size from 0 "
                         f"to {_MAX_GRAPH_BATCH_SIZE}")
    if "unprepared_s" in decode:
        _check_coefficients(decode["unprepared_s"], "fit.graph_decode.unprepared_s", 2)
    graph_sizes = fit.get("graph_sizes")
    if graph_sizes is not None and (not isinstance(graph_sizes, list) or not all(is_count(b) for b in graph_sizes)):
        raise ValueError(f"field 'fit.graph_sizes' is {shown(graph_sizes)}; expected a list of sizes >= 0")
    # The graphs the engine captured (engine_options, what sim.limits tells graph steps from eager ones by) are the
    # ones the fit pads decode steps to (fit.graph_sizes) and up to which it prices them as graphs
    # (fit.max_graph_batch_size), as sim.fit_profile writes all three. Edited apart, they priced decode steps
    # unsaid: graph_sizes [1, 2, 4, 8] priced a 256-row step of qwen3-8b as an 8-row graph (26 % short), and
    # max_graph_batch_size 512 a 400-row step as a 256-row graph, half its eager price.
    options = profile.get("engine_options") if isinstance(profile.get("engine_options"), dict) else {}  # checked
    measured = options.get("cuda_graph_sizes") or [0]  # sim.fit_profile's graph_sizes of an engine without graphs
    if largest != max(measured):
        raise ValueError(f"field 'fit.max_graph_batch_size' is {largest}; expected the largest of field "
                         f"'engine_options.cuda_graph_sizes', {max(measured)} (refit it with python -m "
                         "sim.fit_profile)")
    if graph_sizes is not None and graph_sizes != measured:
        raise ValueError(f"field 'fit.graph_sizes' is {shown(graph_sizes)}; expected field "
                         f"'engine_options.cuda_graph_sizes', {shown(measured)} (refit it with python -m "
                         "sim.fit_profile)")
    # The fit prices decode steps as run ahead or not (its runs_decode_ahead); what the simulation records of the
    # profile's engine and analysis.compare notes come from engine_features. Edited apart, they told another engine.
    ahead, profiled_ahead = fit.get("runs_decode_ahead", False), _profiled_flag(profile, "runs_decode_ahead")
    if ahead is not profiled_ahead:
        raise ValueError(f"field 'fit.runs_decode_ahead' is {_json_shown(ahead)}; expected field "
                         f"'engine_features.runs_decode_ahead', {_json_shown(profiled_ahead)} (refit it with python -m "
                         "sim.fit_profile)")
    pieces = eager.get("piecewise_graph_sizes") or []  # a text or unsorted list was a traceback in the cost model
    if not isinstance(pieces, list) or not all(is_count(b) and b >= 1 for b in pieces) or pieces != sorted(pieces):
        raise ValueError(f"field 'fit.eager.piecewise_graph_sizes' is {shown(pieces)}; expected an increasing list "
                         "of sizes >= 1")
    # The sizes prefill and mixed steps are padded to: [8192] priced a 100-token prefill of qwen3-8b as 8192 tokens
    # (25x its time), [16] padded none.
    if pieces != (options.get("piecewise_graph_sizes") or []):
        raise ValueError(f"field 'fit.eager.piecewise_graph_sizes' is {shown(pieces)}; expected field "
                         f"'engine_options.piecewise_graph_sizes', {shown(options.get('piecewise_graph_sizes') or [])} "
                         "(refit it with python -m sim.fit_profile)")
    if eager.get("form", "max") not in ("sum", "max"):
        raise ValueError(f"field 'fit.eager.form' is {eager.get('form')!r}; expected 'sum' or 'max'")
    form = eager.get("form", "max")
    bases = {"floor": SUM_FLOOR_BASIS, "gpu": SUM_GPU_BASIS} if form == "sum" else {"floor": FLOOR_BASIS,
                                                                                      "gpu": GPU_BASIS}
    knot = eager.get("tokens_knot")
    if knot is not None:
        largest_piece = pieces[-1] if pieces else 0
        if form != "sum" or not is_count(knot) or not 1 <= knot < largest_piece:
            raise ValueError(f"field 'fit.eager.tokens_knot' is {shown(knot)}; expected a number of tokens from 1 to "
                             f"below the largest piecewise graph size ({largest_piece}), in a fit of form 'sum'")
        bases["gpu"] = (*SUM_GPU_BASIS, TOKENS_BEYOND_KNOT)
    for part, basis in bases.items():
        # The coefficients are priced on the form's own features (eager_parts): names of another form's, or of
        # none, meant coefficients fitted on one set of features priced on another, at changed prices unsaid.
        names = eager.get(f"{part}_basis")
        if names is not None and names != list(basis):
            raise ValueError(f"field 'fit.eager.{part}_basis' is {shown(names, 120)}; expected {list(basis)}, the "
                             f"features of form {form!r}; refit it with python -m sim.fit_profile")
        _check_coefficients(eager.get(f"{part}_coef"), f"fit.eager.{part}_coef", len(basis))
    _check_prices_above_zero(decode, eager, form)
    sampling = fit.get("sampling", {})
    if not isinstance(sampling, dict) or not set(sampling) <= set(SAMPLING_MODES):
        raise ValueError(f"field 'fit.sampling' is {shown(sampling)}; expected an object of the sampling modes "
                         f"measured ({', '.join(SAMPLING_MODES)}); refit it with python -m sim.fit_profile")
    for mode, table in sampling.items():
        sizes = table.get("batch_sizes") if isinstance(table, dict) else None
        if not isinstance(sizes, list) or not sizes or not all(is_count(b) and b >= 1 for b in sizes) \
                or sizes != sorted(set(sizes)):
            raise ValueError(f"field 'fit.sampling.{mode}.batch_sizes' is {shown(sizes)}; expected an increasing "
                             "list of batch sizes >= 1")
        _check_coefficients(table.get("extra_s"), f"fit.sampling.{mode}.extra_s", len(sizes))
    # The cost model prices steps with the copy under 'fit' (ProfiledCostModel reads fit.serving); the top-level
    # one is what sim.calibrate wrote and names the profile. Both must hold usable factors, and the same ones.
    _check_serving(profile.get("serving"), "serving")
    _check_serving(fit.get("serving"), "fit.serving")
    difference = _serving_difference(profile.get("serving") or None, fit.get("serving") or None)
    if difference:  # the name said "host x0.83" while steps were priced at another factor, or uncalibrated
        raise ValueError(f"{difference}; expected one calibration in both (sim.calibrate writes the same to each, "
                         "and python -m sim.fit_profile copies 'serving' into 'fit')")


def _check_prices_above_zero(decode: dict, eager: dict, form: str) -> None:
    """Raise ValueError where a fit's (checked, non-negative) coefficients price a step as taking no time: a decode
    graph with an intercept and a per-token time of 0, or an eager fit whose terms that every step has (its
    constant, its sequences, its tokens) are all 0. Such a profile ran at exit 0 with steps of no time (the clock
    stood still, and TTFT and TPOT came out 0.00 ms), or every prefill, of 16 tokens or 8192, at the smallest
    decode intercept."""
    for bs, a, b in zip(decode["batch_sizes"], decode["intercept_s"], decode["per_kv_token_s"]):
        if a == 0 and b == 0:
            raise ValueError(f"fields 'fit.graph_decode.intercept_s' and 'per_kv_token_s' are both 0 at batch size "
                             f"{bs}, which prices its decode steps at zero; expected one of them > 0")
    # Every step has a sequence and a token: (part, basis, index) of the terms that are never 0.
    if form == "sum":  # the host constant, sequences; the padded tokens
        terms = [("floor", SUM_FLOOR_BASIS, 0), ("floor", SUM_FLOOR_BASIS, 1), ("gpu", SUM_GPU_BASIS, 0)]
    else:  # the floor's constant, sequences; the device's constant, tokens
        terms = [("floor", FLOOR_BASIS, 0), ("floor", FLOOR_BASIS, 1), ("gpu", GPU_BASIS, 0), ("gpu", GPU_BASIS, 1)]
    if not any(eager[f"{part}_coef"][i] > 0 for part, _, i in terms):
        names = ", ".join(f"{part}_coef {basis[i]!r}" for part, basis, i in terms)
        raise ValueError(f"field 'fit.eager' has {names} all 0, the terms every prefill and mixed step has; expected "
                         "one of them > 0 (a step of one sequence and one token takes time)")


def _serving_difference(top: dict | None, fitted: dict | None) -> str | None:
    """Where a profile's two copies of its calibration (top-level 'serving', 'fit.serving') differ; None if nowhere."""
    if top == fitted:
        return None
    if top is None or fitted is None:
        present, absent = ("fit.serving", "serving") if top is None else ("serving", "fit.serving")
        return f"field '{present}' holds a calibration and field '{absent}' none"
    # Down to the first value that differs: two decode_extra_s objects that differed in one bucket's extra were quoted
    # whole, cut at the same 40 characters, and the message showed the same text twice.
    path = ""
    while isinstance(top, dict) and isinstance(fitted, dict):
        key = next(k for k in sorted(set(top) | set(fitted), key=str)
                   if top.get(k, _MISSING) != fitted.get(k, _MISSING))
        path += f".{key}"
        if key not in top or key not in fitted:
            break
        top, fitted = top[key], fitted[key]
    else:
        if isinstance(top, list) and isinstance(fitted, list) and len(top) == len(fitted):
            i = next(i for i, (a, b) in enumerate(zip(top, fitted)) if a != b)
            path, top, fitted = f"{path}[{i}]", top[i], fitted[i]
        return f"field 'serving{path}' is {shown(top, 40)} but field 'fit.serving{path}' is {shown(fitted, 40)}"
    text = ["missing" if key not in d else shown(d[key], 40) for d in (top, fitted)]
    return f"field 'serving{path}' is {text[0]} but field 'fit.serving{path}' is {text[1]}"


_MISSING = object()  # a key absent from one copy of the calibration: unlike any value the other can hold


def _check_serving(serving: object, where: str, session: bool = False) -> None:
    """Raise ValueError naming the first serving factor (sim.calibrate's) at ``where`` that would price steps at
    NaN, below zero or beyond any real step, or is missing (from a non-empty block, or any ``session``)."""
    serving = serving or {}
    if not isinstance(serving, dict):
        raise ValueError(f"field '{where}' is {shown(serving)}; expected an object written by sim.calibrate")
    for name in SERVING_FACTORS:
        value = serving.get(name, 1.0)
        if not _is_seconds(value) or value < _MIN_FACTOR:
            raise ValueError(f"field '{where}.{name}' is {value!r}; expected a finite number from {_MIN_FACTOR:g} to "
                             f"{_MAX_COEFFICIENT:g}")
    measured = serving.get("measured", list(SERVING_FACTORS))  # sim.calibrate --add averages each over these
    if not isinstance(measured, list) or not all(name in SERVING_FACTORS for name in measured):
        raise ValueError(f"field '{where}.measured' is {shown(measured)}; expected a list of the factors the runs "
                         f"measured, of {', '.join(SERVING_FACTORS)}")
    share = serving.get("host_share", 0.5)
    if not _is_seconds(share) or share > 1:
        raise ValueError(f"field '{where}.host_share' is {share!r}; expected a number from 0 to 1")
    most = max_host_share(serving.get("decode_factor", 1.0), serving.get("host_factor", 1.0))
    if "host_share" in serving and share > most:
        # Decode steps at host slowdown s cost decode_factor + host_share x (s - host_factor) times the grid: a
        # steeper line reaches zero at a host speed --host-slowdown takes (and band replays draw), and such a run
        # priced its decode steps below zero, a simpy "Negative delay" traceback.
        raise ValueError(f"field '{where}.host_share' is {share!r}; expected at most {where}.decode_factor / "
                         f"{where}.host_factor ({most:.4g}): a steeper share prices decode steps at or below zero on "
                         "a fast host")
    for name in ("host_factor_range", "decode_factor_range"):
        span = serving.get(name, [1.0, 1.0])
        if (not isinstance(span, list) or len(span) != 2 or not all(_is_seconds(v) and v >= _MIN_FACTOR for v in span)
                or span[0] > span[1]):
            raise ValueError(f"field '{where}.{name}' is {shown(span)}; expected [low, high], "
                             f"{_MIN_FACTOR:g} <= low <= high <= {_MAX_COEFFICIENT:g}")
    _check_host_episodes(serving.get("host_episodes"), f"{where}.host_episodes")
    _check_decode_extras(serving.get("decode_extra_s"), f"{where}.decode_extra_s")
    runs = serving.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"field '{where}.runs' is {shown(runs)}; expected a list of objects (the runs it was "
                         "calibrated on)")
    for i, run in enumerate(runs):  # sim.calibrate --add tells a run added again by these: a list was a TypeError
        if "run" in run and not isinstance(run["run"], str):
            raise ValueError(f"field '{where}.runs[{i}].run' is {shown(run['run'])}; expected the run's folder name, "
                             "a string")
        if "num_steps" in run and not is_count(run["num_steps"]):
            raise ValueError(f"field '{where}.runs[{i}].num_steps' is {shown(run['num_steps'])}; expected the run's "
                             "step count, an integer >= 0")
    if "num_eager_steps" in serving and not is_count(serving["num_eager_steps"]):
        raise ValueError(f"field '{where}.num_eager_steps' is {serving['num_eager_steps']!r}; expected an integer "
                         ">= 0")
    sessions = serving.get("sessions")  # sim.calibrate --add averages over them and appends one
    if sessions is not None:
        if not isinstance(sessions, list) or not all(isinstance(x, dict) for x in sessions):
            raise ValueError(f"field '{where}.sessions' is {shown(sessions)}; expected a list of objects written "
                             "by sim.calibrate --add")
        for i, session in enumerate(sessions):
            _check_serving(session, f"{where}.sessions[{i}]", session=True)
    for name in ("host_factor", "decode_factor"):  # sim.calibrate writes both; the cost model's name quotes one
        if (serving or session) and name not in serving:  # a block without them was a KeyError traceback
            raise ValueError(f"field '{where}.{name}' is missing; expected a finite number > 0")


def _check_decode_extras(extras: object, where: str) -> None:
    """Raise ValueError naming what of ``serving.decode_extra_s`` (sim.calibrate's seconds per graph bucket) the
    cost model cannot price with; absent is fine."""
    if extras is None:
        return
    if not isinstance(extras, dict):
        raise ValueError(f"field '{where}' is {shown(extras)}; expected an object written by sim.calibrate")
    sizes, values = extras.get("batch_sizes"), extras.get("extra_s")
    # Bounded as the graphs are (check_fit): sim.calibrate writes one per graph bucket. A hand-made list of 200,000
    # sizes took 8 s to load, and sim.calibrate --add's merge of such lists grew with their square.
    if (not isinstance(sizes, list) or not sizes or not all(is_count(b) and 1 <= b <= _MAX_GRAPH_BATCH_SIZE
                                                            for b in sizes)
            or sizes != sorted(set(sizes))):
        raise ValueError(f"field '{where}.batch_sizes' is {shown(sizes)}; expected increasing batch sizes from 1 to "
                         f"{_MAX_GRAPH_BATCH_SIZE}")
    if not isinstance(values, list) or len(values) != len(sizes) or not all(_is_seconds(v) and v <= 1 for v in values):
        raise ValueError(f"field '{where}.extra_s' is {shown(values)}; expected one number of seconds from 0 to 1 "
                         f"per batch size ({len(sizes)})")
    # The steps each bucket's extra was measured on: sim.calibrate --add sums them over the sessions, and a number,
    # text or NaN there was a TypeError traceback (or "cannot convert float NaN to integer") after the runs were read.
    counts = extras.get("num_steps", [])
    if not isinstance(counts, list) or len(counts) not in (0, len(sizes)) or not all(is_count(c) for c in counts):
        raise ValueError(f"field '{where}.num_steps' is {shown(counts)}; expected one step count (an integer >= 0) "
                         f"per batch size ({len(sizes)})")


def _check_host_episodes(episodes: object, where: str) -> None:
    """Raise ValueError naming the first value of ``serving.host_episodes`` (sim.calibrate's record of the host's
    slow episodes, from which sim.bands draws its replays') that no episodes process takes; each may be absent."""
    from sim.host_speed import MAX_SLOWDOWN, MIN_EPISODE_S, MIN_SLOW_SHARE  # it imports this module

    if episodes is None:
        return
    if not isinstance(episodes, dict):
        raise ValueError(f"field '{where}' is {shown(episodes)}; expected an object written by sim.calibrate")
    ratio = episodes.get("slow_over_normal", 1.0)
    if not _is_seconds(ratio) or not 1 <= ratio <= MAX_SLOWDOWN:
        raise ValueError(f"field '{where}.slow_over_normal' is {ratio!r}; expected a number from 1 to "
                         f"{MAX_SLOWDOWN:g}")
    span = episodes.get("slow_share_range", [0.0, 0.0])
    if not isinstance(span, list) or len(span) != 2 or not all(_is_seconds(v) for v in span) \
            or not span[0] <= span[1] < 1:
        raise ValueError(f"field '{where}.slow_share_range' is {shown(span)}; expected [low, high], "
                         "0 <= low <= high < 1")
    # A band replay's slow share is drawn from this range, and its normal periods last MEAN_S * (1 - share) / share
    # on average: a share of 1e-320 overflowed that to inf and every --bands replay failed with a traceback. A share
    # below one in a billion is none (sim.calibrate writes 0 for a host without slow episodes).
    if any(0 < v < MIN_SLOW_SHARE for v in span):
        raise ValueError(f"field '{where}.slow_share_range' is {shown(span)}; expected shares of 0 or from "
                         f"{MIN_SLOW_SHARE:g} (below that there are no slow episodes: write 0)")
    mean_s = episodes.get("mean_episode_s", 1.0)
    if not _is_seconds(mean_s) or mean_s < MIN_EPISODE_S:
        raise ValueError(f"field '{where}.mean_episode_s' is {mean_s!r}; expected a number of seconds from "
                         f"{MIN_EPISODE_S:g} to {_MAX_COEFFICIENT:g}")
    # The windows they were measured over: sim.calibrate --add sums them over the sessions, and a text or null was a
    # TypeError traceback, NaN "cannot convert float NaN to integer", after the runs were read.
    if "num_windows" in episodes and not is_count(episodes["num_windows"]):
        raise ValueError(f"field '{where}.num_windows' is {shown(episodes['num_windows'])}; expected a number of "
                         "windows (an integer >= 0)")


def read_profile(path: Path) -> dict:
    """A profile JSON file as written by ``python -m sim.profile``, checked; ValueError naming the file otherwise."""
    try:
        profile = json.loads(read_json_input(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the profile ({getattr(exc, 'strerror', None) or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg}); expected a profile written by "
                         "python -m sim.profile") from None
    except RecursionError:  # arrays nested thousands deep were a RecursionError traceback
        raise ValueError(f"{path}: JSON nested too deeply to read; expected a profile written by python -m "
                         "sim.profile") from None
    try:
        check_profile(profile)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return profile


def write_profile(path: Path, profile: dict) -> None:
    """Written whole (through a rename) and without NaN, which JSON readers elsewhere refuse (ValueError naming the
    file: the one on disk is left as it was)."""
    try:
        text = json.dumps(profile, indent=1, allow_nan=False) + "\n"
    except ValueError as exc:  # "Out of range float values are not JSON compliant: inf", from a value not checked
        raise ValueError(f"{path}: not written: the profile would hold a NaN or infinite value ({exc})") from None
    try:
        write_text_atomic(Path(path), text)
    except OSError as exc:
        raise OSError(f"{path}: cannot write the profile ({exc.strerror or exc})") from None


def _with_continues_batch(point: dict) -> dict:
    """A grid point whose features say whether its step repeated the batch before it (profiles measured before the
    feature existed: the 'decode' families time steps that repeat it, the others' decode steps follow a prefill)."""
    if "continues_batch" in point["features"]:
        return point
    continues = int(point["family"] in ("decode", "decode_skewed"))
    return {**point, "features": {**point["features"], "continues_batch": continues}}


def describe_held_out(held: dict) -> str:
    """The held-out error of a fit (``fit_profile(...)["held_out"]``) in words; a grid too small to hold points out
    (three or fewer a family) has none, said so."""
    if not held.get("num_points") or held.get("mean_abs_rel_error") is None:
        return "no held-out points (every family has 3 or fewer; the fit could not be checked on points it did not see)"
    return (f"held-out |error| mean {held['mean_abs_rel_error']:.1%}, p90 {held['p90_abs_rel_error']:.1%}, "
            f"max {held['max_abs_rel_error']:.1%} over {held['num_points']} points")


def fit_profile(profile: dict) -> dict:
    """Fit on three of every four grid points per family; report the error on the fourth."""
    check_profile(profile)
    _check_serving(profile.get("serving"), "serving")  # copied into the fit below, which prices steps with it
    points = [_with_continues_batch(p) for p in profile["points"]]
    ahead = _profiled_flag(profile, "prepares_decode_ahead")  # absent from profiles of engines that did not plan ahead
    sizes = profile["engine_options"].get("cuda_graph_sizes") or [0]
    max_graph_bs = max(sizes)
    train, held = [], []
    counters: dict[str, int] = {}
    for p in points:
        i = counters.get(p["family"], 0)
        counters[p["family"]] = i + 1
        (held if i % 4 == 3 else train).append(p)
    graph = [p for p in train if _is_graph_step(p["features"], max_graph_bs)]
    no_decode = max_graph_bs > 0 and not any(p["family"] == "decode" for p in graph)
    if no_decode or len(graph) == len(train):
        raise ValueError(f"{len(points)} points: too few to fit; the points fitted on (three of every four per "
                         "family) need one eager point and, with CUDA graphs, one 'decode' point of a graph batch size")
    piecewise_sizes = profile["engine_options"].get("piecewise_graph_sizes") or []
    fit = _fit(train, max_graph_bs, sizes, piecewise_sizes, ahead)
    fit["graph_sizes"] = sizes
    model = ProfiledCostModel(fit, name="fit")
    errors = [abs(model.predict(p["features"]) - p["median_s"]) / p["median_s"] for p in held]
    by_family = {}
    for family in sorted({p["family"] for p in held}):
        errs = [abs(model.predict(p["features"]) - p["median_s"]) / p["median_s"]
                for p in held if p["family"] == family]
        by_family[family] = round(float(np.mean(errs)), 4)
    fit["held_out"] = {
        "num_points": len(held),
        "mean_abs_rel_error": float(np.mean(errors)) if errors else None,
        "p90_abs_rel_error": float(np.percentile(errors, 90)) if errors else None,
        "max_abs_rel_error": float(np.max(errors)) if errors else None,
        "mean_abs_rel_error_by_family": by_family,
    }
    train_errors = [abs(model.predict(p["features"]) - p["median_s"]) / p["median_s"] for p in train]
    # The model kept is fitted on every point: the held-out points are the grid's edges of each family
    # (every fourth, in grid order), which the simulator needs as much as the rest.
    final = _fit(points, max_graph_bs, sizes, piecewise_sizes, ahead)
    final["graph_sizes"] = sizes
    # An engine that launches a step repeating its batch before the step before is postprocessed (run-ahead): its
    # 'decode' points time such steps, and its step logs mark them (ran_ahead), as the simulator's then do.
    final["runs_decode_ahead"] = _profiled_flag(profile, "runs_decode_ahead")
    final_model = ProfiledCostModel(final, name="fit")
    all_errors = [abs(final_model.predict(p["features"]) - p["median_s"]) / p["median_s"] for p in points]
    final["held_out"] = fit["held_out"]
    final["train_mean_abs_rel_error"] = float(np.mean(train_errors))
    final["all_points_mean_abs_rel_error"] = float(np.mean(all_errors))
    final["all_points_p90_abs_rel_error"] = float(np.percentile(all_errors, 90))
    sampling = fit_sampling(profile.get("sampling_points", []))
    if sampling:
        final["sampling"] = sampling
    fit = final
    if profile.get("serving"):  # python -m sim.calibrate; the errors above are on the grid, uncalibrated
        fit["serving"] = profile["serving"]
    return fit


class ProfiledCostModel:
    def __init__(self, fit: dict, name: str, sampling: str = "greedy") -> None:
        self.name = name
        self.fit = fit
        # The profile's 'model' as sim.profile wrote it (load): a shipped config's name, or the folder it was given
        # (with a '/'). None for a model built from a fit alone.
        self.measured_model: str | None = None
        # What the profiled engine did (sim.profile's engine_features: run-ahead, the decode-attention overlap); a run
        # folder records it, so that analysis.compare can say where the real engine did otherwise.
        self.engine_features: dict | None = None
        self.runs_decode_ahead = fit.get("runs_decode_ahead") is True
        decode = fit["graph_decode"]
        sizes = sorted(fit.get("graph_sizes") or decode["batch_sizes"])
        self.max_graph_bs = fit["max_graph_batch_size"]
        measured = np.array(decode["batch_sizes"], dtype=float)
        # Per decode batch size: the graph bucket it is padded to, then that bucket's interpolated a and b.
        self._graph_bucket = [0] + [next((s for s in sizes if s >= bs), sizes[-1])
                                    for bs in range(1, self.max_graph_bs + 1)]
        self._decode_a = [0.0] * (self.max_graph_bs + 1)
        self._decode_b = [0.0] * (self.max_graph_bs + 1)
        if self.max_graph_bs:  # (none where the profile has no graph batches: np.interp refuses the empty grid)
            # One interpolation for every batch size, the same floats as one a batch size, which took 512 numpy calls.
            buckets = self._graph_bucket[1:]
            self._decode_a[1:] = np.interp(buckets, measured, decode["intercept_s"]).tolist()
            self._decode_b[1:] = np.interp(buckets, measured, decode["per_kv_token_s"]).tolist()
        per_excess_s = float(decode.get("per_excess_context_token_s", 0.0))
        skew_min_bs = int(decode.get("skew_min_batch_size", 0))
        self._per_excess_s = [per_excess_s if bs >= skew_min_bs else 0.0 for bs in range(self.max_graph_bs + 1)]
        c, d = decode.get("unprepared_s", (0.0, 0.0))
        self._unprepared_s = [c + d * bs for bs in range(self.max_graph_bs + 1)]  # a step not planned ahead
        # Host-bound work runs slower in serving than on the profiling grid (python -m sim.calibrate): on
        # average the eager floor (all host) by host_factor, decode steps by decode_factor. A host slowdown
        # f scales the floor by f and decode steps along the line through (1, 1) and (host_factor,
        # decode_factor), of slope host_share (1/2 when uncalibrated); by default f = host_factor.
        serving = fit.get("serving") or {}
        self.host_factor = float(serving.get("host_factor", 1.0))
        self.decode_factor = float(serving.get("decode_factor", 1.0))
        # The eager steps' device part (sim.calibrate.fit_eager_factors; 1 where it was not fitted). It does not
        # follow a host slowdown: the GPU is the same whatever the host's speed.
        self.device_factor = float(serving.get("device_factor", 1.0))
        share = serving.get("host_share")  # measured across machine sessions (sim.calibrate --add), if it was
        if share is None:
            share = (self.decode_factor - 1.0) / (self.host_factor - 1.0) if abs(self.host_factor - 1.0) > 0.01 else 0.5
        # At most decode_factor / host_factor (max_host_share): the line's value at a host slowdown of 0, its device
        # part, decode_factor - host_share x host_factor, is then >= 0 and every slowdown > 0 prices decode steps
        # above zero. The line through (1, 1) and a calibration of host x0.9, decode x0.85 has slope 1.5, held at 1:
        # --host-slowdown 0.02 priced decode steps at -0.03x the grid, a simpy "Negative delay" traceback.
        self.host_share = min(1.0, max(0.0, float(share)), max_host_share(self.decode_factor, self.host_factor))
        # Decode steps that repeat their batch (CUDA-graph replays launched while the host finishes the step before)
        # take the grid's time times repeat_decode_factor, plus their bucket's extra below; the others (after a
        # prefill, a finish or a preemption, planned while they run) decode_factor times the grid. sim.calibrate
        # writes 1 where it measured the extras: on the H100 the one factor fitted to both kinds (1.10) priced small
        # repeating batches 10-14 % long where their time was the grid's, and the steps after a prefill right
        # (validation/results/h100-session32-2026-12-05). Without the field, decode_factor for both, as calibrated
        # before. A host slowdown moves both along the same relative slope.
        repeat = serving.get("repeat_decode_factor")
        self.repeat_factor = self.decode_factor if repeat is None else float(repeat)
        self.repeat_share = (self.host_share if repeat is None
                             else self.host_share * self.repeat_factor / self.decode_factor)
        # Seconds a serving decode step that repeats its batch takes beyond the calibrated grid's price, per graph
        # bucket (sim.calibrate's decode_extra_s; 0 where not calibrated): the grid times equal contexts, serving
        # batches mix them. A step that does not repeat its batch keeps the grid's price (its planning surcharge,
        # measured after a prefill): with the extra too, held-out runs' such steps came out 5-11 % long.
        extra = serving.get("decode_extra_s")
        self._decode_extra_s = [0.0] * (self.max_graph_bs + 1)
        if extra:  # one interpolation for every batch size: once per batch size, it read the lists anew each time
            buckets = self._graph_bucket[1:]
            self._decode_extra_s[1:] = np.interp(buckets, extra["batch_sizes"], extra["extra_s"]).tolist()
        eager = fit["eager"]
        self.eager_form = eager.get("form", "max")
        self._piecewise_sizes = list(eager.get("piecewise_graph_sizes") or [])
        self._tokens_knot = int(eager.get("tokens_knot") or 0)  # 0: a fit without the hinge term
        # (As float64 values, the floats np.dot multiplied by: _dot.)
        self._floor_coef = np.array(eager["floor_coef"], dtype=float).tolist()
        self._gpu_coef = np.array(eager["gpu_coef"], dtype=float).tolist()
        # The host floor of each eager row met (a tuple of the row's values -> its dot product, as eager_parts
        # computes it): a handful of counts (rows, prefill rows, decode rows or not), so a few distinct rows in a whole
        # simulation, kept rather than summed at every prefill step (np.dot, as it was, was ~1.6 % of simulate() on the
        # Azure trace, ~1.2 % on 64 replicas).
        self._floor_s_of_row: dict[tuple, float] = {}
        self._min_s = float(min(decode["intercept_s"])) if decode["intercept_s"] else 1e-4
        # What sampling adds to a step beyond the grid's greedy argmax, for a replay whose requests sample
        # (``sampling``: SimConfig.sampling_mode), as the profile measured it (fit.sampling): the sampler's kernels,
        # device work that no host slowdown or serving factor scales. A mode the profile did not measure is priced as
        # greedy (``prices_sampling`` False), which sim.limits warns of.
        self.sampling = sampling
        table = (fit.get("sampling") or {}).get(sampling) if sampling != "greedy" else None
        self.prices_sampling = sampling == "greedy" or table is not None
        self._sampling_sizes = list(table["batch_sizes"]) if table else []
        self._sampling_extra = [float(v) for v in table["extra_s"]] if table else []
        self._sampling_s = [self.sampling_s(rows) for rows in range(self.max_graph_bs + 1)]
        # decode_run_from_s's per-bucket coefficients, 0-d arrays: a, b, the extra and sampling's (None where 0.0,
        # which adds nothing to a positive price), the calibrated scale, the skew's, the repeating steps' scale.
        scale, repeat_scale = np.array(self.decode_factor), np.array(self.repeat_factor)
        self._run_coefficients = [(np.array(self._decode_a[bs]), np.array(self._decode_b[bs]),
                                   np.array(self._decode_extra_s[bs]) if self._decode_extra_s[bs] else None,
                                   np.array(self._sampling_s[bs]) if self._sampling_s[bs] else None, scale,
                                   np.array(self._per_excess_s[bs]), repeat_scale)
                                  for bs in range(self.max_graph_bs + 1)]
        self._repeating_price_tables: dict[int, np.ndarray] = {}  # decode_steps_s's, by batch size
        self._num_passes_untabled: dict[int, int] = {}  # ... and the passes each size took before its table

    def sampling_s(self, num_rows: int) -> float:
        """What sampling ``num_rows`` rows adds to a step (0 for greedy): interpolated between the batch sizes
        measured, and beyond the largest at its cost per row (the sampler's passes grow with the rows there)."""
        sizes = self._sampling_sizes
        if not sizes or num_rows <= 0:
            return 0.0
        if num_rows > sizes[-1]:
            return self._sampling_extra[-1] * num_rows / sizes[-1]
        return float(np.interp(num_rows, sizes, self._sampling_extra))

    def _decode_scale(self, host_slowdown: float) -> float:
        return self.decode_factor + self.host_share * (host_slowdown - self.host_factor)

    def _repeat_scale(self, host_slowdown: float) -> float:
        """``_decode_scale`` of a decode step that repeats its batch (the same float where the profile has no
        repeat_decode_factor)."""
        return self.repeat_factor + self.repeat_share * (host_slowdown - self.host_factor)

    @classmethod
    def load(cls, path: Path, model: str | None = None, gpu: str | None = None,
             tensor_parallel_size: int | None = None, sampling: str = "greedy") -> ProfiledCostModel:
        """The profile at ``path``; with ``model``, ``gpu`` and ``tensor_parallel_size``, one measured for
        exactly that deployment (another model's or GPU's step times would be silently wrong); pricing the
        ``sampling`` of a replay's requests where the profile measured it."""
        try:
            profile = json.loads(read_json_input(path))
            _check_deployment(profile)
            measured = (Path(profile["model"]).name, profile["gpu"], profile["tensor_parallel_size"])
            # The engine options and the points, which sim.limits reads the grid's range from after the run and
            # sim.bands the step noise: a profile without them (its 'points' deleted) passed, and lost both unsaid.
            check_profile(profile)
            check_fit(profile)
            fit = profile["fit"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            detail = str(exc) if type(exc) is ValueError else f"{type(exc).__name__}: {exc}"  # ours name the field
            raise ValueError(f"cost model {path}: not a readable profile ({detail})") from None
        except RecursionError:  # arrays nested thousands deep were a RecursionError traceback
            raise ValueError(f"cost model {path}: not a readable profile (JSON nested too deeply to read)") from None
        asked = (model, gpu, tensor_parallel_size)
        for what, was, wanted in zip(("model", "GPU", "tensor-parallel size"), measured, asked):
            if wanted is not None and str(was).lower() != str(wanted).lower():
                raise ValueError(f"cost model {path} was measured for {what} {was}, not {wanted}; profile that "
                                 f"deployment (python -m sim.profile) or use --cost-model roofline")
        name = f"profile:{profile['gpu']}/{Path(path).stem} (measured {profile.get('measured_at', '?')})"
        if profile.get("serving"):
            name += f", serving-calibrated ({calibration_label(profile['serving'])})"
        loaded = cls(fit, name, sampling)
        if sampling != "greedy" and loaded._sampling_sizes:  # unmeasured: priced as greedy, which sim.limits warns of
            loaded.name += f", sampling {'with top-k/top-p' if sampling == 'filters' else 'with a temperature'} " \
                           "as measured"
        loaded.measured_model = profile["model"]
        features = profile.get("engine_features")
        if isinstance(features, dict):  # flags and names only (check_profile): no NaN reaches summary.json
            loaded.engine_features = dict(features)
        return loaded

    def graph_bucket(self, num_decode_seqs: int) -> int:
        """The CUDA-graph batch size a decode step of ``num_decode_seqs`` rows (1 to max_graph_bs) is padded to."""
        return self._graph_bucket[num_decode_seqs]

    def eager_parts(self, f: dict) -> tuple[float, float]:
        """A prefill or mixed step's host part and device time at the grid's host speed (``combine`` adds them
        up, or takes the larger for an engine that launched such steps eagerly)."""
        if self.eager_form == "sum":
            return (self._floor_s(_sum_floor_row(f)),
                    _dot(self._gpu_coef, _sum_gpu_row(f, self._piecewise_sizes, self._tokens_knot)))
        return self._floor_s(_floor_row(f)), _dot(self._gpu_coef, _gpu_row(f))

    def _floor_s(self, row: list[float]) -> float:
        """``_dot(self._floor_coef, row)``, each distinct row's computed once (rows equal value for value give the very
        float)."""
        key = tuple(row)
        floor_s = self._floor_s_of_row.get(key)
        if floor_s is None:
            floor_s = self._floor_s_of_row[key] = _dot(self._floor_coef, row)
        return floor_s

    def combine(self, host_s, gpu_s):
        """A step's time from its host part (already scaled to the host's speed) and its device time; works on
        numpy arrays too."""
        return host_s + gpu_s if self.eager_form == "sum" else np.maximum(host_s, gpu_s)

    def host_time(self, f: dict, real_s: float) -> tuple[float, float] | None:
        """For a step whose host part outweighs its device part on the grid: (the real time its host part took,
        the grid's host part), whose ratio is the host's slowdown; None for device-bound steps. The device part
        taken off is the one this model prices (its calibrated device factor): a host slowdown read off a run scales
        the host part beside it (predict). With the grid's device time instead, a profile calibrated to device x0.89
        read a host at 0.90x as 0.86x, and sim.replay priced that run's steps short."""
        floor, gpu = self.eager_parts(f)
        if floor <= 0 or floor < gpu:
            return None
        return (max(real_s - self.device_factor * gpu, 0.0), floor) if self.eager_form == "sum" else (real_s, floor)

    def predict(self, f: dict, host_slowdown: float | None = None, num_sampled_rows: int | None = None) -> float:
        """Step time for features ``f`` at ``host_slowdown`` against the grid (default: the calibrated average).
        ``num_sampled_rows``: the rows of an eager step that sample (sampled_rows); features alone cannot tell a
        prefill chunk that ends its prompt from one that does not, so without it every row is taken to sample."""
        slowdown = self.host_factor if host_slowdown is None else host_slowdown
        if _is_graph_step(f, self.max_graph_bs):
            # Step logs recorded before max_decode_context_tokens or continues_batch: priced as they were then.
            continues = f.get("continues_batch", 1)
            grid = self._decode_grid(f["num_decode_seqs"], f["decode_context_tokens"],
                                     f.get("max_decode_context_tokens", 0), continues)
            if continues:
                price = self._repeat_scale(slowdown) * grid + self._decode_extra_s[f["num_decode_seqs"]]
            else:
                price = self._decode_scale(slowdown) * grid
            sampling_s = self._sampling_s[f["num_decode_seqs"]]
            return price + sampling_s if sampling_s else price  # step_time_s's and decode_run_s's order of additions
        floor, gpu = self.eager_parts(f)
        price = max(float(self.combine(slowdown * floor, self.device_factor * gpu)), self._min_s)
        if not self._sampling_sizes:
            return price
        return price + self.sampling_s(f["num_seqs"] if num_sampled_rows is None else num_sampled_rows)

    def _decode_grid(self, bs: int, kv, longest, continues: int):
        """A graph decode step's time on the grid, before serving factors; operators only, so the contexts may be
        arrays (one entry per step of a run) and give the very floats they give one by one."""
        grid = self._decode_a[bs] + self._decode_b[bs] * kv
        per_excess_s = self._per_excess_s[bs]
        if per_excess_s:  # 0 below the skew's smallest batch, where the term would add 0.0: the same floats
            grid = grid + per_excess_s * _excess_context(bs, kv, longest)
        return grid if continues else grid + self._unprepared_s[bs]

    def step_time_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> float:
        # hot path: a decode step at the calibrated host speed skips the features dict
        if host_slowdown is None and batch.num_prefill_tokens == 0 and 0 < batch.num_decode_seqs <= self.max_graph_bs:
            return self.decode_step_s(batch.num_decode_seqs, batch.decode_context_tokens,
                                      batch.max_decode_context_tokens, batch.continues_batch)
        return self.predict(batch_features(batch), host_slowdown,
                            sampled_rows(batch) if self._sampling_sizes else None)

    def decode_step_s(self, bs: int, context: int, longest: int, continues: int) -> float:
        """``step_time_s`` of a decode-only CUDA-graph batch (0 < ``bs`` <= max_graph_bs) at the calibrated host speed,
        given by its numbers (``decode_steps_s``'s): the step loop's price of every such step, and sim.runner's of the
        steps of a short quiet segment, summed one by one (``decode_steps_s``'s array, the same floats, costs some
        fifteen numpy calls a segment of a few steps)."""
        if continues:
            price = self.repeat_factor * self._decode_grid(bs, context, longest, 1)
            price = price + self._decode_extra_s[bs]
        else:
            price = self.decode_factor * self._decode_grid(bs, context, longest, 0)
        sampling_s = self._sampling_s[bs]
        return price + sampling_s if sampling_s else price

    def decode_run_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> np.ndarray | None:
        """``step_time_s`` of a run of decode steps at once: ``batch``'s decode_context_tokens and
        max_decode_context_tokens are arrays, one entry per step, each step's one token longer a sequence than the
        step before (a quiet run, as sim.runner builds it), and its ``continues_batch`` is the first step's (the later
        ones repeat the batch); identical floats. None when the batch is not a CUDA-graph decode (an eager step's dot
        product takes no arrays). Priced by ``decode_run_from_s`` from the run's first step (sim.bands asks this one):
        one copy of the arithmetic, not two."""
        if batch.num_prefill_tokens or not 0 < batch.num_decode_seqs <= self.max_graph_bs:
            return None
        contexts, longest = batch.decode_context_tokens, batch.max_decode_context_tokens
        batch.decode_context_tokens, batch.max_decode_context_tokens = int(contexts[0]), int(longest[0])
        try:
            return self.decode_run_from_s(batch, len(contexts), host_slowdown)
        finally:  # the batch given back as it came
            batch.decode_context_tokens, batch.max_decode_context_tokens = contexts, longest

    def decode_run_from_s(self, batch: ScheduledBatch, num_steps: int,
                          host_slowdown: float | None = None) -> np.ndarray | None:
        """``decode_run_s`` of the ``num_steps`` decode steps from ``batch`` as it is (its contexts the first step's
        scalars; each later step's one token longer a sequence), the contexts built here (sim.runner takes this when
        present): the very floats, in a new array. Cheaper per pass than decode_run_s on the runner's two int64
        aranges: the contexts as floats from the start (exact: integers far below 2**53, as step_time_s's int-float
        operations convert them), so no operation casts an int64 array (about 1.7x the instructions of a float one);
        the longest context built only where the skew term reads it (batches from its smallest size on); the
        arithmetic in place on the one array (an addition or a product is commutative, bit for bit)."""
        if batch.num_prefill_tokens or not 0 < batch.num_decode_seqs <= self.max_graph_bs:
            return None
        return self.decode_steps_s(batch.num_decode_seqs, batch.decode_context_tokens,
                                   batch.max_decode_context_tokens, batch.continues_batch, num_steps, host_slowdown)

    def decode_steps_s(self, bs: int, context: int, longest: int, continues: int, num_steps: int,
                       host_slowdown: float | None = None) -> np.ndarray | None:
        """``decode_run_from_s`` of a decode-only batch given by its numbers (no batch to read or to set: sim.runner
        takes this when present): ``bs`` rows whose contexts in the first step sum to ``context``, the longest
        ``longest``, that step continuing the batch before it as ``continues`` says. None unless ``bs`` is a CUDA-graph
        batch (0 < bs <= max_graph_bs). The same floats from a table of prices by context where it holds them."""
        if not 0 < bs <= self.max_graph_bs:
            return None
        end = context + bs * num_steps
        # Below the skew's smallest batch a step's price depends on its context alone: the repeating steps' read from
        # the table of them (a copy: the caller may change it), the first one priced apart where it does not repeat
        # the batch before it. A fleet's replicas hold a row or two, and a pass of ~150 steps took some ten numpy
        # operations, each costing more than its work.
        table = self._repeating_prices(bs, end) if host_slowdown is None else None
        if table is not None:
            price = table[context:end:bs].copy()
            if not continues:
                price[0] = self.decode_step_s(bs, context, longest, 0)
            return price
        first = float(context)  # float arange: start + i * bs, exact for integers
        return self._decode_prices(bs, np.arange(first, first + bs * num_steps, bs), longest, continues, host_slowdown)

    def _repeating_prices(self, bs: int, end: int) -> np.ndarray | None:
        """The price of a decode step of ``bs`` rows that repeats its batch, at every context sum from 0 to ``end`` at
        least, by ``_decode_prices``, at the calibrated host speed; grown by doubling. None for a skewed batch (its
        price reads the longest context too), beyond _MAX_TABLED_ROWS or _MAX_PRICED_CONTEXT, and for the first
        _PASSES_BEFORE_TABLE passes of a size: a table of tens of thousands of contexts costs as much as some twenty
        passes, and a replay of one busy replica meets most sizes in a few passes only (as its batch grows and
        shrinks): tabled at once, ShareGPT at 40 req/s took 0.4 % more instructions."""
        if self._per_excess_s[bs] or bs > _MAX_TABLED_ROWS or end > _MAX_PRICED_CONTEXT:
            return None
        table = self._repeating_price_tables.get(bs)
        if table is not None and end < len(table):
            return table
        if table is None:
            num_passes = self._num_passes_untabled.get(bs, 0) + 1
            self._num_passes_untabled[bs] = num_passes
            if num_passes <= _PASSES_BEFORE_TABLE:
                return None
        # (At least 4,096 contexts: a fleet's single rows start from a few hundred and grow.)
        size = min(max(end + 1, 2 * (0 if table is None else len(table)), 4096), _MAX_PRICED_CONTEXT + 1)
        table = self._repeating_price_tables[bs] = self._decode_prices(bs, np.arange(float(size)), 0, 1, None)
        return table

    def _decode_prices(self, bs: int, contexts: np.ndarray, longest: int, continues: int,
                       host_slowdown: float | None) -> np.ndarray:
        """The prices of decode steps of ``bs`` rows whose summed contexts are ``contexts`` (float64, exact integers;
        made the prices in place), the first continuing the batch before it as ``continues`` says and the others
        repeating it, the first's longest context ``longest`` and each next one's a token longer (read where the
        batch is skewed): ``decode_steps_s``'s arithmetic, element by element."""
        price = contexts
        num_steps = len(price)
        # The coefficients as 0-d float64 arrays (the same floats): a Python float operand costs each operation
        # some 1,600 instructions more (numpy's promotion of a weak scalar), more than the operation itself on ~50
        # floats.
        a, b, extra_s, sampling_s, scale, per_excess_s, repeat_scale = self._run_coefficients[bs]
        skewed = self._per_excess_s[bs] != 0.0
        if skewed:  # _decode_grid's per_excess_s * _excess_context(bs, kv, longest), element by element
            excess = price / bs
            longest = float(longest)
            np.subtract(np.arange(longest, longest + num_steps), excess, out=excess)
            excess *= excess > 0
            excess *= per_excess_s
        price *= b
        price += a
        if skewed:
            price += excess
        if not continues:
            price[0] += self._unprepared_s[bs]
        if host_slowdown is not None:
            scale, repeat_scale = self._decode_scale(host_slowdown), self._repeat_scale(host_slowdown)
        if continues:
            price *= repeat_scale  # every step repeats its batch
        elif self.repeat_factor == self.decode_factor and self.repeat_share == self.host_share:
            price *= scale  # one scale for both kinds of step (element by element: the same floats as split)
        else:  # the first step after a prefill or a finish, the others repeating it
            price[:1] *= scale
            price[1:] *= repeat_scale
        if extra_s is not None:
            if continues:
                price += extra_s
            else:
                price[1:] += extra_s
        if sampling_s is not None:
            price += sampling_s
        return price


def max_host_share(decode_factor: float, host_factor: float) -> float:
    """The largest ``serving.host_share`` that keeps decode steps' price above zero at every host slowdown > 0: the
    one whose line through (host_factor, decode_factor) passes through the origin (a decode step all host work)."""
    return decode_factor / host_factor


def calibration_label(serving: dict) -> str:
    """A calibration (a profile's checked 'serving' block) as the cost model's name quotes it: 'host x0.83, 6
    machine sessions'."""
    sessions = len(serving.get("sessions") or ())
    machines = f", {sessions} machine sessions" if sessions > 1 else ""
    device = serving.get("device_factor", 1.0)
    device = f", device x{device:.2f}" if round(device, 2) != 1.0 else ""
    return f"host x{serving['host_factor']:.2f}{device}{machines}"


def profile_path(model: str, gpu: str, tensor_parallel_size: int = 1) -> Path:
    suffix = f"-tp{tensor_parallel_size}" if tensor_parallel_size > 1 else ""
    return PROFILE_DIR / gpu.lower() / f"{model}{suffix}.json"


def find_profile(model: str, gpu: str, tensor_parallel_size: int = 1) -> Path | None:
    path = profile_path(model, gpu, tensor_parallel_size)
    return path if path.is_file() else None
