"""Calibrate a measured profile on real serving runs: ``python -m sim.calibrate PROFILE RUN_DIR [RUN_DIR ...]``.

The profiling grid times each step shape right after an identical one, on an otherwise idle host (often
another machine start than the serving runs). This fits one factor on the host part of the model of
prefill and mixed steps (the launch floor of an engine that launched them eagerly from Python, or the
serving-side host work of one that replays piecewise CUDA graphs), so that those steps of the given GPU
replays (``steps.parquet``) take, in total, the time they took for real, and, where the runs hold both host-bound
and device-bound such steps (short and long prompts), one on their device part too (``fit_eager_factors``);
decode steps (CUDA graph replays) get one factor the same way. A step's real time is its period (to the next
step's start, where the engine went straight on): the loop's work between steps is real time the simulator counts
in its steps. Use runs of traces the validation does not replay. One run suffices for the host factor; the device
factor needs prompts of both kinds (the two calibration slices of validation/run_gpu.sh). How the
host's speed varied over each run (``sim.host_episodes``: slow windows, their share and length, read off
the steps whose host part outweighs their device part) is recorded too, as ``serving.host_episodes``:
``sim.replay --bands`` draws its replays' slow episodes from it.

Machines differ too: the same GPU model behind another host, on another day, serves the same trace 5-17 %
slower or faster (validation/README.md). ``--add`` keeps the factors already in the profile as earlier machine
sessions and adds these runs as one more (``serving.sessions``): the profile then prices with the mean of the
sessions' factors, and ``sim.replay --bands`` gives each replay one of the sessions' own host factors (the range
they span is ``serving.host_factor_range``). Give each session's runs to one call: they should come from one machine
start.

A factor is fitted only on steps of its kind: the host factor on MIN_RUN_STEPS eager steps or more, the device
factor where fit_eager_factors can tell it, the decode factor on MIN_RUN_STEPS decode steps (where the extras are
measured, on MIN_BUCKET_STEPS after a prefill or a finish). Each session records the factors its runs measured
(``measured``), and ``--add`` averages each factor over the sessions that measured it (sessions calibrated before the
record count as measured). A factor these runs do not measure is the grid's 1.0, and the printed line says so: a
calibration without ``--add`` replaces the profile's, whose factors may be another machine's; ``--add`` keeps them.
Runs that measure neither the host nor the decode factor are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from engine.core.config_args import OneLineErrorParser
from engine.core.interrupt import exit_130_on_interrupt, exit_when_done, outputs_in_place
from engine.core.messages import counted, escape_controls
from engine.core.sampling_params import GREEDY_BELOW_TEMPERATURE
from sim.bands import MEAN_EPISODE_S, SLOW_OVER_NORMAL, SLOW_SHARE_RANGE
from sim.batch_features import read_steps
from sim.files import read_parquet_table
from sim.host_episodes import fit_host_episodes
from sim.limits import grid_range
from sim.profiled_cost_model import (
    SERVING_FACTORS,
    UNMEASURED_FACTOR,
    ProfiledCostModel,
    _check_serving,
    _is_graph_step,
    fit_profile,
    max_host_share,
    measured_factors,
    measured_values,
    read_profile,
    write_profile,
)
from sim.run_kind import gpu_run_problem, read_summary
from traces.files import ends_as_parquet

# A run this short says nothing about a host's speed; one step could hold a factor of 4 (the clamp) by itself.
MIN_RUN_STEPS = 10
# Below this share of the eager steps' predicted time, their host part cannot be told from the device part's error:
# qwen3-8b's Azure calibration slice (host 18 %) gave a host factor of 0.55 from device-bound steps predicted 9 % long,
# and the ~70 % validation run then came out 6-11 % short (validation/README.md).
MIN_HOST_SHARE = 0.25
# No step lasts beyond this (analysis.schema's bound on a run's times); 1e300 s was written into the profile.
MAX_STEP_S = 1e12
# A device factor is fitted beside the host factor only where the eager steps' host shares spread this much (their
# standard deviation, weighted by predicted time): Azure's short prompts (host ~50 %) together with Mooncake's long
# ones (~5 %) spread 0.25-0.26 on three machine starts and gave device factors of 0.965-0.986; either slice alone
# (0.03-0.15) gave 0.94-1.07 and host factors that moved with them.
MIN_HOST_SHARE_SPREAD = 0.2
HOST_FACTOR_BOUNDS = (0.25, 4.0)  # beyond these a factor says more about the runs than about a machine
DEVICE_FACTOR_BOUNDS = (0.5, 2.0)
DECODE_FACTOR_BOUNDS = (0.5, 2.0)
# A graph bucket's serving extra (fit_decode_extras) is measured from this many steps that repeat their batch; fewer
# leave it to the nearest measured bucket's.
MIN_BUCKET_STEPS = 50
# No decode step is a second longer than the grid's price of it: more says the runs are not this deployment's.
MAX_DECODE_EXTRA_S = 1.0


def check_step_durations(run_dir: Path, num_steps: int) -> None:
    """Raise ValueError naming the run folder's steps.parquet unless it has MIN_RUN_STEPS steps, each measured
    above 0 s and within MAX_STEP_S (read_steps refuses NaN, infinite and negative ones): a GPU step takes time,
    and all-zero or absurd durations would calibrate the profile to nonsense that sim.replay then prices with."""
    path = Path(run_dir) / "steps.parquet"
    if num_steps < MIN_RUN_STEPS:
        raise ValueError(f"{path}: {num_steps} steps; expected at least {MIN_RUN_STEPS} to calibrate on")
    check_measured_durations(run_dir)


def check_measured_durations(run_dir: Path) -> None:
    """Raise ValueError naming the run folder's steps.parquet and row unless every step was measured above 0 s and
    within MAX_STEP_S: what every reader that divides by a GPU run's step times needs (validation/step_errors.py
    divided by a class's total of 0 s, a ZeroDivisionError traceback)."""
    path = Path(run_dir) / "steps.parquet"
    durations = read_parquet_table(path, columns=["duration_s"]).column("duration_s").to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~((durations > 0) & (durations <= MAX_STEP_S)))
    if len(bad):
        row = int(bad[0])
        raise ValueError(f"{path}: row {row}: column 'duration_s' is {float(durations[row])!r}; expected a measured "
                         f"step time > 0 and at most {MAX_STEP_S:g} s")


def fit_host_factor(floor_s: np.ndarray, gpu_s: np.ndarray, real_s: np.ndarray, combine=np.maximum) -> float:
    """The k for which sum(combine(k * floor, gpu)) equals sum(real) (combine: the cost model's, the larger of
    the two or their sum): monotone in k, found by bisection (held within HOST_FACTOR_BOUNDS)."""
    def total(k: float) -> float:
        return float(combine(k * floor_s, gpu_s).sum())

    lo, hi = HOST_FACTOR_BOUNDS
    target = float(real_s.sum())
    if total(lo) >= target:
        return lo
    if total(hi) <= target:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < target else (lo, mid)
    return (lo + hi) / 2


def host_share_spread(floor_s: np.ndarray, gpu_s: np.ndarray) -> float:
    """How much the eager steps' host shares (host part over predicted time) differ: their standard deviation,
    each step weighted by its predicted time."""
    total_s = floor_s + gpu_s
    if not total_s.sum() > 0:
        return 0.0
    share = np.divide(floor_s, total_s, out=np.zeros_like(total_s), where=total_s > 0)
    mean = float((share * total_s).sum() / total_s.sum())
    return float(np.sqrt(((share - mean) ** 2 * total_s).sum() / total_s.sum()))


def fit_eager_factors(floor_s: np.ndarray, gpu_s: np.ndarray, real_s: np.ndarray,
                      form: str) -> tuple[float, float | None]:
    """(host factor, device factor) for the eager steps of an additive model (``form`` "sum": host part plus device
    time): the pair that matches their total time and their total weighted by each step's host share, so that the
    host-bound steps and the device-bound ones each come out right on average. One factor alone fitted on a mix of
    both made short-prompt steps 4-7 % short and long-prompt ones 2-4 % long on three machine starts (the grid's device
    times are not the serving machine's). Falls back to the host factor alone (device factor None) for the "max" form,
    where the shares do not spread enough to tell the two apart (MIN_HOST_SHARE_SPREAD), or where the pair leaves
    its bounds."""
    host_only = (fit_host_factor(floor_s, gpu_s, real_s, np.maximum if form == "max" else np.add), None)
    if form != "sum" or host_share_spread(floor_s, gpu_s) < MIN_HOST_SHARE_SPREAD:
        return host_only
    total_s = floor_s + gpu_s
    share = floor_s / total_s  # total_s > 0 here: the spread of all-zero predictions is 0
    moments = np.array([[floor_s.sum(), gpu_s.sum()], [(share * floor_s).sum(), (share * gpu_s).sum()]])
    targets = np.array([real_s.sum(), (share * real_s).sum()])
    try:
        host, device = (float(x) for x in np.linalg.solve(moments, targets))
    except np.linalg.LinAlgError:
        return host_only
    if not (HOST_FACTOR_BOUNDS[0] <= host <= HOST_FACTOR_BOUNDS[1]
            and DEVICE_FACTOR_BOUNDS[0] <= device <= DEVICE_FACTOR_BOUNDS[1]):
        return host_only
    return host, device


def fit_decode_extras(graph_sizes: list[int], buckets: np.ndarray, residual_s: np.ndarray) -> dict | None:
    """Per CUDA-graph bucket, the mean time serving decode steps took beyond the grid's price (``residual_s``: real
    minus predicted, for steps that repeat their batch, each in graph bucket ``buckets``), held at 0 or above.

    Why not one factor on every decode step: the grid times decode steps whose sequences all hold the same context;
    serving batches mix short and long ones, and the split-KV kernel then waits for the ranges of the longest. On three
    H200 machine starts (qwen3-0.6b, Azure, prefill-heavy and Mooncake traces) that cost about 0.02 ms a step at 16
    rows or fewer, 0.2 at 17-32 and 0.4 above, the same on every trace, load and start, while the step itself takes
    1.6-5 ms. One factor fitted on the Azure calibration slice (17-48 rows) priced a light Azure run's and the
    prefill-heavy trace's small batches 8 % long; extras fitted on the same slice priced every held-out run's such
    steps within 2 % (validation/results/decode-extras-2026-12-04).

    A bucket with fewer than MIN_BUCKET_STEPS steps takes the extra of the nearest bucket that has them (the larger
    one on a tie); None when no bucket has them."""
    measured = {}
    for size in graph_sizes:
        mask = buckets == size
        if mask.sum() >= MIN_BUCKET_STEPS:
            measured[size] = (float(np.clip(residual_s[mask].mean(), 0.0, MAX_DECODE_EXTRA_S)), int(mask.sum()))
    if not measured:
        return None
    nearest = _nearest_measured(graph_sizes, list(measured))
    extras = [round(measured[nearest[size]][0], 7) for size in graph_sizes]
    counts = [measured[size][1] if size in measured else 0 for size in graph_sizes]
    return {"batch_sizes": list(graph_sizes), "extra_s": extras, "num_steps": counts}


def _nearest_measured(graph_sizes: list[int], measured: list[int]) -> dict[int, int]:
    """Per graph bucket, the measured bucket whose extra it takes: itself, or the nearest one (the larger on a tie)."""
    order = {size: i for i, size in enumerate(graph_sizes)}
    return {size: min(measured, key=lambda m: (abs(order[m] - order[size]), -m)) for size in graph_sizes}


def _eager_fields(model: ProfiledCostModel, floor_s: np.ndarray, gpu_s: np.ndarray, real_s: np.ndarray,
                  names: str) -> dict:
    """The serving block's fields of the eager steps (predicted host and device parts, real times) of the runs
    ``names``: host and device factors where they measure them, the grid's 1 where not (``measured`` lists which),
    and what the grid made of them."""
    fields = {"host_factor": UNMEASURED_FACTOR, "device_factor": UNMEASURED_FACTOR, "measured": [],
              "num_eager_steps": len(real_s), "eager_time_ratio_uncalibrated": None, "eager_host_share": None,
              "eager_host_share_spread": None}
    if len(real_s) < MIN_RUN_STEPS:  # the host factor would be fitted on these alone
        return fields
    if not real_s.sum() > 0:
        raise ValueError(f"{names}: the eager steps took 0 s in all; expected measured step times")
    host_k, device_k = fit_eager_factors(floor_s, gpu_s, real_s, model.eager_form)
    predicted_s = float(model.combine(floor_s, gpu_s).sum())  # the eager steps' time, uncalibrated
    return {
        **fields,
        "host_factor": round(host_k, 4),
        "device_factor": round(device_k, 4) if device_k is not None else UNMEASURED_FACTOR,
        "measured": ["host_factor"] + ["device_factor"] * (device_k is not None),
        "eager_time_ratio_uncalibrated": round(predicted_s / float(real_s.sum()), 4),
        # The host part's share of the eager steps' predicted time: where it is small, the host factor absorbs the
        # device part's error rather than measuring the host (main warns below MIN_HOST_SHARE).
        "eager_host_share": round(float(floor_s.sum()) / predicted_s, 4) if predicted_s > 0 else 0.0,
        "eager_host_share_spread": round(host_share_spread(floor_s, gpu_s), 4),
    }


def calibrate(profile: dict, run_dirs: list[Path], grid_fit: dict | None = None) -> dict:
    """The ``serving`` block for ``profile``: host factor and what it was fitted on. ``grid_fit`` is the
    profile's fit without serving factors, when the caller has it already."""
    model = ProfiledCostModel(grid_fit or fit_profile({**profile, "serving": None}), "grid")
    floors, gpus, reals, num_decode, decode_pred, decode_real = [], [], [], 0, 0.0, 0.0
    graph_sizes = sorted(model.fit.get("graph_sizes") or model.fit["graph_decode"]["batch_sizes"])
    decode_buckets, decode_reals, decode_grids = [], [], []  # steps that repeat their batch: fit_decode_extras
    num_fresh, fresh_real_s, fresh_grid_s = 0, 0.0, 0.0  # decode steps that do not repeat their batch
    # ... within the grid's decode contexts: beyond them the model extrapolates (Mooncake's 16-60k contexts at 8-16
    # rows missed by 0.2-0.3 ms a step), an error of another kind than the extras measure.
    grid_limits = grid_range(profile)
    runs, host_bound = [], []
    for run_dir in run_dirs:
        steps = read_steps(run_dir, periods=True)  # the simulator runs steps back to back: match their periods
        check_step_durations(run_dir, len(steps))
        # The folder's own name, however it was spelled: given as '.', a run was recorded as "" (and printed as
        # "from  (the grid model ..."), which --add's check for a run added twice then matched on nothing but ''.
        runs.append({"run": Path(os.path.abspath(run_dir)).name, "num_steps": len(steps),
                     "host": _run_host(Path(run_dir))})
        host_bound.append([])
        for f, real, start in steps:
            if _is_graph_step(f, model.max_graph_bs):
                num_decode += 1
                predicted = model.predict(f)
                decode_pred += predicted
                decode_real += real
                within = (f["max_decode_context_tokens"] <= grid_limits.longest_decode_context
                          and f["decode_context_tokens"] <= grid_limits.decode_kv_tokens)
                if not f["continues_batch"]:
                    num_fresh += 1
                    fresh_real_s += real
                    fresh_grid_s += predicted
                if f["continues_batch"] and within:  # the extras price only such steps (ProfiledCostModel)
                    decode_buckets.append(model.graph_bucket(f["num_decode_seqs"]))
                    decode_reals.append(real)
                    decode_grids.append(predicted)
            else:
                floor, gpu = model.eager_parts(f)
                floors.append(floor)
                gpus.append(gpu)
                reals.append(real)
                host = model.host_time(f, real)
                if host is not None:  # host-bound: its time follows the host's speed
                    host_bound[-1].append((*host, start))
    names = ", ".join(map(str, run_dirs))
    if len(reals) < MIN_RUN_STEPS and num_decode < MIN_RUN_STEPS:
        # A factor fitted on fewer steps is one or two steps' noise (a run of 12 steps, 2 of them prefills, had its
        # host factor fitted on those 2); without either kind there is nothing to write but the grid's 1.
        raise ValueError(f"{names}: nothing to calibrate on: {counted(len(reals), 'eager step')} (with a prefill) "
                         f"and {counted(num_decode, 'CUDA-graph decode step')}; expected at least {MIN_RUN_STEPS} "
                         "of either")
    serving = _eager_fields(model, np.array(floors), np.array(gpus), np.array(reals), names)
    buckets, repeat_real_s, repeat_grid_s = np.array(decode_buckets), np.array(decode_reals), np.array(decode_grids)
    # Where the runs measure the extras, the steps that repeat their batch are priced at the grid's time plus their
    # bucket's extra (repeat_decode_factor 1), and decode_factor is the others' real over grid time (steps after a
    # prefill, a finish or a preemption, planned while they run). One factor on both kinds had taken the others' (1.10
    # on an H100: their planning and launch run on a slower host) for every step, and priced repeating batches of 1-8
    # rows, whose time was the grid's, 10-14 % long (Mooncake's TPOT 15 % long; validation/results/
    # h100-session32-2026-12-05). Without extras, one factor on every decode step, as before them.
    extras = fit_decode_extras(graph_sizes, buckets, repeat_real_s - repeat_grid_s)
    if extras is not None:
        serving["repeat_decode_factor"] = 1.0
        # Too few steps after a prefill or a finish to tell their factor by: the grid's price (with its planning
        # surcharge) for them.
        measures_decode = num_fresh >= MIN_BUCKET_STEPS and fresh_grid_s > 0
        decode_k = fresh_real_s / fresh_grid_s if measures_decode else UNMEASURED_FACTOR
    else:
        measures_decode = num_decode >= MIN_RUN_STEPS and decode_pred > 0
        decode_k = decode_real / decode_pred if measures_decode else UNMEASURED_FACTOR
    serving["decode_factor"] = round(max(DECODE_FACTOR_BOUNDS[0], min(DECODE_FACTOR_BOUNDS[1], decode_k)), 4)
    serving["num_decode_steps"] = num_decode
    serving["decode_time_ratio_uncalibrated"] = round(decode_pred / decode_real, 4) if decode_real else None
    # Without extras the decode factor prices the repeating steps too: measured with it.
    repeat_measured = extras is not None or measures_decode
    serving["measured"] += ["decode_factor"] * measures_decode + ["repeat_decode_factor"] * repeat_measured
    serving["runs"] = runs
    if extras is not None:
        serving["decode_extra_s"] = extras
    # Whether the factors carry a difference of machines as well as of conditions (None: not recorded).
    # Recorded by sim.profile as an object; anything else (a hand-edited string or list) counts as not recorded: it
    # was a traceback at the end, after the calibrated profile had been written.
    profile_host = profile.get("host") if isinstance(profile.get("host"), dict) else None
    hosts = [r["host"] for r in runs]
    serving["same_host_as_profile"] = (None if profile_host is None or None in hosts
                                       else all(h == profile_host for h in hosts))
    episodes = fit_host_episodes(host_bound)  # how the speed varied: sim.bands draws its replays' episodes from it
    if episodes is not None:
        serving["host_episodes"] = episodes
    return serving


def with_sessions(previous: dict | None, session: dict) -> dict:
    """The ``serving`` block of a profile calibrated on several machine sessions: ``previous`` (the profile's block,
    itself one session or several) and one more. Each factor is the mean over the sessions that measured it (each
    session counts once, however many steps it had: the spread between machines is what the mean is taken over; a
    factor none measured is the grid's 1); ``host_share``, how much of a host slowdown decode steps feel, is the
    slope of decode over host factor across the sessions that measured both, when they differ by more than 0.02 in
    host factor; the host episodes' ranges are the union of the sessions'."""
    sessions = list(previous.get("sessions") or [previous]) if previous else []
    sessions = [{k: v for k, v in old.items() if k != "sessions"} for old in sessions] + [session]
    hosts = measured_values(sessions, "host_factor", lambda s: s["host_factor"])
    decodes = measured_values(sessions, "decode_factor", lambda s: s["decode_factor"])
    # Older sessions fitted no device factor: the grid's device time, as they priced it.
    devices = measured_values(sessions, "device_factor", lambda s: s.get("device_factor", 1.0))
    merged = {
        "host_factor": round(float(hosts.mean()), 4),
        "decode_factor": round(float(decodes.mean()), 4),
        "device_factor": round(float(devices.mean()), 4),
        "host_factor_range": [round(float(hosts.min()), 4), round(float(hosts.max()), 4)],
        "decode_factor_range": [round(float(decodes.min()), 4), round(float(decodes.max()), 4)],
        "measured": [name for name in SERVING_FACTORS if any(name in measured_factors(s) for s in sessions)],
        "runs": [run for s in sessions for run in s.get("runs", [])],
        "num_eager_steps": int(sum(s.get("num_eager_steps", 0) for s in sessions)),
        "same_host_as_profile": session.get("same_host_as_profile"),
        "sessions": sessions,
    }
    repeating = [s for s in sessions if "repeat_decode_factor" in measured_factors(s)]
    if any("repeat_decode_factor" in s for s in repeating):
        # A session calibrated before the field priced its repeating decode steps with its decode factor.
        repeats = [s.get("repeat_decode_factor", s["decode_factor"]) for s in repeating]
        merged["repeat_decode_factor"] = round(float(np.mean(repeats)), 4)
    both = [s for s in sessions if {"host_factor", "decode_factor"} <= measured_factors(s)]
    both_hosts = np.array([s["host_factor"] for s in both], dtype=float)
    if len(both) and np.ptp(both_hosts) > 0.02:
        slope = float(np.polyfit(both_hosts, [s["decode_factor"] for s in both], 1)[0])
        # No steeper than the line through the origin (max_host_share), which the cost model refuses: decode steps
        # would be priced at or below zero on a fast enough host.
        merged["host_share"] = min(round(min(1.0, max(0.0, slope)), 4),
                                   max_host_share(merged["decode_factor"], merged["host_factor"]))
    extras = [s["decode_extra_s"] for s in sessions if s.get("decode_extra_s")]
    if extras:
        # Per bucket, the mean over the sessions that measured extras (sessions calibrated before them had none).
        # One interpolation and one lookup table per session: per bucket and session, they read each session's
        # lists anew (a time that grew with their square).
        sizes = extras[-1]["batch_sizes"]
        filled = np.array([np.interp(sizes, e["batch_sizes"], e["extra_s"]) for e in extras])
        counts = [dict(zip(e["batch_sizes"], e.get("num_steps") or [])) for e in extras]
        # Where some sessions measured a bucket (steps counted in it), the mean of theirs alone: the others' value
        # there is their nearest measured bucket's, copied. Four Azure calibrations that never formed 64+ rows held a
        # decode-heavy calibration's measured extras at those buckets to a fifth of its weight. Where none measured
        # it, the mean of all, as before. A session that recorded no counts (written by hand) counts everywhere.
        measured = np.array([[c.get(b, 0) > 0 for b in sizes] if c else [True] * len(sizes) for c in counts])
        measured[:, ~measured.any(axis=0)] = True
        means = (filled * measured).sum(axis=0) / measured.sum(axis=0)
        merged["decode_extra_s"] = {
            "batch_sizes": sizes,
            "extra_s": [round(float(m), 7) for m in means],
            "num_steps": [int(sum(c.get(b, 0) for c in counts)) for b in sizes],
        }
    episodes = [s["host_episodes"] for s in sessions if s.get("host_episodes")]
    if episodes:
        # A hand-written session may lack a value: sim.bands' default stands in for it, as when it replays.
        spans = [e.get("slow_share_range", SLOW_SHARE_RANGE) for e in episodes]
        # How slow and how long slow episodes are, only sessions that saw some measured (fit_host_episodes writes
        # 1 and one window for the others); where none did, those stand-ins, all alike.
        slow = [e for e, span in zip(episodes, spans) if span[1] > 0] or episodes
        ratios = [e.get("slow_over_normal", SLOW_OVER_NORMAL) for e in slow]
        merged["host_episodes"] = {
            "slow_over_normal": round(float(np.mean(ratios)), 4),
            "slow_share_range": [min(span[0] for span in spans), max(span[1] for span in spans)],
            "mean_episode_s": round(float(np.mean([e.get("mean_episode_s", MEAN_EPISODE_S) for e in slow])), 3),
            **{k: episodes[-1][k] for k in ("window_s", "slow_window") if k in episodes[-1]},
            "num_windows": int(sum(e.get("num_windows", 0) for e in episodes)),
        }
    return merged


def _measured_counts(sessions: list[dict]) -> str:
    """How many of ``sessions`` measured each factor, as 'host 2, device 1, decode 2 of 2'."""
    counts = [f"{name.removesuffix('_factor')} {sum(name in measured_factors(s) for s in sessions)}"
              for name in ("host_factor", "device_factor", "decode_factor")]
    return f"{', '.join(counts)} of {len(sessions)}"


def _already_added(previous: dict | None, session: dict) -> list[str]:
    """The runs of ``session`` that the profile's calibration (``previous``, one session or several) already holds:
    the same folder name, step count and host. Added again they would count as one more machine session."""
    if not previous:
        return []
    held = {(r.get("run"), r.get("num_steps"), json.dumps(r.get("host"), sort_keys=True))
            for old in (previous.get("sessions") or [previous]) for r in old.get("runs", [])}
    return [r["run"] for r in session["runs"]
            if (r["run"], r["num_steps"], json.dumps(r.get("host"), sort_keys=True)) in held]


def _sampled_with(run_dir: Path) -> str | None:
    """The sampling a run folder's summary.json records its requests took beyond greedy ('temperature 0.6, top_k
    20'), None for a greedy run (or one that records none): its steps took what the sampler adds, which the serving
    factors (fitted on greedy steps) must not absorb; sim.replay prices sampling apart, as the profile measured it."""
    config = read_summary(run_dir).get("config")
    if not isinstance(config, dict):
        return None
    temperature = config.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or \
            not temperature >= GREEDY_BELOW_TEMPERATURE:
        return None
    return ", ".join(f"{name} {config[name]}" for name in ("temperature", "top_k", "top_p") if name in config)


def _other_deployment(run_dir: Path, profile: dict) -> str | None:
    """What of the deployment a run folder's summary.json records (config's model, tensor-parallel size and
    device) differs from the profile's, as ``what run, not profile``; None when all agree or are not recorded.
    Another model's or GPU's step times fitted the profile's factors to that deployment without a word."""
    config = read_summary(run_dir).get("config")
    if not isinstance(config, dict):
        return None
    # A profile without a model is named by what reads it (host_speed's was said to have model 'None').
    model = profile.get("model")
    # An engine that launches decode steps ahead takes less time for them than the profile of one that does not
    # prices (and the other way round): its step times would fit the factors to the other engine.
    features = profile.get("engine_features")
    profile_ahead = features.get("runs_decode_ahead") if isinstance(features, dict) else None
    # Likewise mixed steps with decode attention beside prefill attention (engine option overlap_decode_attention);
    # a profile that records engine features but not this one was measured before the option existed: off.
    profile_overlap = features.get("overlaps_decode_attention", False) if isinstance(features, dict) else None
    pairs = (("model", config.get("model"), None if model is None else Path(str(model)).name),
             ("tensor-parallel size", config.get("tensor_parallel_size"), profile.get("tensor_parallel_size")),
             ("device", config.get("device"), profile.get("device")),
             ("run-ahead", _on_off(config.get("run_ahead")), _on_off(profile_ahead)),
             ("decode attention overlap", _on_off(config.get("overlap_decode_attention")), _on_off(profile_overlap)))
    for what, run_value, profile_value in pairs:
        if run_value is None or profile_value is None:
            continue
        run_text = Path(str(run_value)).name if what == "model" else str(run_value)  # a model directory: its name
        if run_text.lower() != str(profile_value).lower():
            return f"{what} {run_text}, not the profile's {profile_value}"
    return None


def _on_off(value: object) -> str | None:
    return {True: "on", False: "off"}.get(value) if isinstance(value, bool) else None


def _steps_digest(run_dir: Path) -> str | None:
    """A hash of a run folder's steps.parquet, None where it cannot be read (named later, where the steps are)."""
    path = Path(run_dir) / "steps.parquet"
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            # A file that is no parquet is named where the steps are read: a sparse 100 GB one was hashed first, for
            # minutes, before that one line.
            if not ends_as_parquet(f, os.fstat(f.fileno()).st_size):
                return None
            f.seek(0)
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _run_host(run_dir: Path) -> dict | None:
    """The host an engine.replay folder was recorded on (its summary.json's config.host), None if not recorded."""
    config = read_summary(run_dir).get("config")
    host = config.get("host") if isinstance(config, dict) else None
    return host if isinstance(host, dict) else None


def _eager_words(s: dict, grid_fit: dict) -> str:
    """What the printed line says of session ``s``'s eager-step factors."""
    if "host_factor" not in s["measured"]:
        return (f"host factor {s['host_factor']} (not measured: {counted(s['num_eager_steps'], 'eager step')}, "
                f"fewer than {MIN_RUN_STEPS})")
    if "device_factor" in s["measured"]:
        device = f", device factor {s['device_factor']}"
    elif grid_fit["eager"].get("form", "max") != "sum":  # fit_eager_factors fits none for it
        device = " (no device factor: the profile's eager steps take the larger of their host and device parts)"
    elif s["eager_host_share_spread"] < MIN_HOST_SHARE_SPREAD:
        device = (f" (no device factor: the eager steps' host shares spread {s['eager_host_share_spread']:.2f}, "
                  f"under {MIN_HOST_SHARE_SPREAD:g}; give runs with both short and long prompts)")
    else:
        # The pair fitted on these runs left its bounds (or could not be solved): fit_eager_factors fell back to the
        # host factor alone. The line said the shares spread "0.21, under 0.2", and asked for runs it already had.
        device = (f" (no device factor: the host and device pair these runs fit lies outside host "
                  f"{HOST_FACTOR_BOUNDS[0]:g}-{HOST_FACTOR_BOUNDS[1]:g} and device {DEVICE_FACTOR_BOUNDS[0]:g}-"
                  f"{DEVICE_FACTOR_BOUNDS[1]:g}; the host factor alone is fitted)")
    return f"host factor {s['host_factor']}{device} from {s['num_eager_steps']} eager steps"


def _decode_words(s: dict) -> str:
    """What the printed line says of session ``s``'s decode factor."""
    repeat = "repeating steps: the grid plus their extras" if "repeat_decode_factor" in s else ""
    if "decode_factor" in s["measured"]:
        return f"decode factor {s['decode_factor']}" + (f" (after a prefill or a finish; {repeat})" if repeat else "")
    why = (f"fewer than {MIN_BUCKET_STEPS} decode steps after a prefill or a finish; {repeat}" if repeat
           else f"{counted(s['num_decode_steps'], 'CUDA-graph decode step')}, fewer than {MIN_RUN_STEPS}")
    return f"decode factor {s['decode_factor']} (not measured: {why})"


def _grid_ratio_words(s: dict) -> str:
    """How much of the runs' eager and decode time the uncalibrated grid gave, for the kinds they hold."""
    ratios = []
    if s["eager_time_ratio_uncalibrated"] is not None:
        ratios.append(f"{s['eager_time_ratio_uncalibrated']:.3f} of their eager")
    if s["decode_time_ratio_uncalibrated"] is not None:
        ratios.append(f"{s['decode_time_ratio_uncalibrated']} of their decode")
    return f"the grid model gave {' and '.join(ratios)} time"


def _print_calibration(path: Path, profile: dict, s: dict, grid_fit: dict, added: bool) -> None:
    """The lines about the factors fitted (``s``, the session of runs) and written into the profile at ``path``."""
    print(f"{escape_controls(path)}: {_eager_words(s, grid_fit)}, {_decode_words(s)}, from "
          f"{', '.join(r['run'] for r in s['runs'])} ({_grid_ratio_words(s)})")
    unmeasured = [name.removesuffix("_factor") for name in ("host_factor", "decode_factor")
                  if name not in s["measured"]]
    if unmeasured and not added:
        print(f"note: the runs measured no {' or '.join(unmeasured)} factor: the profile prices those steps at the "
              "grid's time (factor 1.0); calibrate with --add to keep an earlier calibration's and add these runs "
              "to it")
    if "host_factor" in s["measured"] and "device_factor" not in s["measured"] and \
            s["eager_host_share"] < MIN_HOST_SHARE:
        print(f"warning: the eager steps are device-bound (their host part is {s['eager_host_share']:.0%} of their "
              f"predicted time): host factor {s['host_factor']} was fitted to the device part's error, not the "
              "host's speed; check it against a validation run, or keep the uncalibrated profile")
    # A factor at its bound is not what the runs measured: the steps ran beyond it (another deployment unrecorded in
    # a summary.json, a damaged step log), and the line above gave 0.25 or 2.0 as if fitted.
    for name, bounds in (("host_factor", HOST_FACTOR_BOUNDS), ("decode_factor", DECODE_FACTOR_BOUNDS)):
        if s[name] in bounds:
            print(f"warning: {name.replace('_', ' ')} {s[name]} is at its bound ({bounds[0]:g}-{bounds[1]:g}): the "
                  "runs' steps lie beyond it, and the profile prices them at the bound; check that the runs are of "
                  "this profile's deployment")
    # An extra held at its bound is no more measured than a factor at its bound: the line above says nothing of
    # extras, and an extra of a second a step (runs of another deployment) was written without a word.
    extras = s.get("decode_extra_s") or {"batch_sizes": [], "extra_s": [], "num_steps": []}
    at_bound = [str(b) for b, e, n in zip(extras["batch_sizes"], extras["extra_s"], extras["num_steps"])
                if n and e >= MAX_DECODE_EXTRA_S]  # the buckets measured: the others take the nearest one's
    if at_bound:
        print(f"warning: the decode extra of graph batch size {', '.join(at_bound)} is at its bound "
              f"({MAX_DECODE_EXTRA_S:g} s a step): the runs' decode steps lie beyond it; check that the runs are of "
              "this profile's deployment")
    if added:
        merged = profile["serving"]
        lo, hi = merged["host_factor_range"]
        print(f"{counted(len(merged['sessions']), 'machine session')}: the profile prices with host factor "
              f"{merged['host_factor']}, device factor {merged['device_factor']} and decode factor "
              f"{merged['decode_factor']} (the means of the sessions that measured each: "
              f"{_measured_counts(merged['sessions'])}; the grid's 1.0 where none did); host factors span {lo}-{hi}")
    if s["same_host_as_profile"] is False:
        print(f"note: the runs were recorded on another host than the profile ({profile['host'].get('node')}); the "
              "factors carry that difference too")


@exit_130_on_interrupt()
def main(argv: list[str] | None = None) -> int:
    parser = OneLineErrorParser(prog="python -m sim.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="profile JSON written by python -m sim.profile (updated in place)")
    parser.add_argument("runs", nargs="+", help="engine.replay output folders (their steps.parquet) on the same GPU")
    parser.add_argument("--add", action="store_true",
                        help="keep the profile's calibration as earlier machine sessions and add these runs as another "
                             "(the profile prices with the sessions' mean; --bands draws machines from the sessions)")
    args = parser.parse_args(argv)
    path = Path(args.profile)
    runs = [Path(r) for r in args.runs]
    seen: dict[Path, str] = {}
    contents: dict[str, str] = {}
    for run in runs:
        real = Path(os.path.realpath(run))  # Path.resolve raised a RuntimeError traceback on a symbolic link loop
        if real in seen:  # its steps would count twice
            parser.exit(2, f"error: run folder {run} is given twice (also as {seen[real]})\n")
        seen[real] = str(run)
        digest = _steps_digest(run)
        if digest is not None and digest in contents:
            # A copy of a run (another folder, the same steps.parquet) counted its steps twice, as one run given
            # twice did: the factors were fitted with its steps weighted double, at exit 0.
            parser.exit(2, f"error: run folder {run} holds the same steps.parquet as {contents[digest]}; give each run "
                           "once\n")
        if digest is not None:
            contents[digest] = str(run)
        # A simulation's step times are a cost model's: calibrating on them would fit the model to itself.
        not_gpu = gpu_run_problem(run, "calibrate on engine.replay runs")
        if not_gpu:
            parser.exit(2, f"error: {not_gpu}\n")
        sampled = _sampled_with(run)
        if sampled:
            parser.exit(2, f"error: run folder {run} sampled its requests ({sampled}); calibrate on greedy "
                           "engine.replay runs (no --temperature): the serving factors scale greedy steps, and "
                           "sim.replay adds what sampling costs as the profile measured it\n")
    try:
        profile = read_profile(path)  # named here, before the runs are read
        if args.add:  # its calibration is kept and averaged over: a malformed one was a traceback at the end
            _check_serving(profile.get("serving"), "serving")
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n" if str(exc).startswith(str(path)) else f"error: {path}: {exc}\n")
    for run in runs:
        other = _other_deployment(run, profile)
        if other:
            parser.exit(2, f"error: run folder {run} was recorded with {other} ({path}); calibrate a profile on runs "
                           "of its own deployment\n")
    try:
        grid_fit = fit_profile({**profile, "serving": None})  # fitted once: calibrate prices the runs with it
    except ValueError as exc:
        parser.exit(2, f"error: {path}: {exc}\n")
    try:
        session = calibrate(profile, runs, grid_fit)
        repeated = _already_added(profile.get("serving"), session) if args.add else []
        if repeated:
            parser.exit(2, f"error: {path} already holds run {repeated[0]} (the same folder name, step count and "
                           "host): --add takes the runs of another machine session, once\n")
        profile["serving"] = with_sessions(profile.get("serving"), session) if args.add else session
        profile["fit"] = {**grid_fit, "serving": profile["serving"]}
        write_profile(path, profile)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    # The profile is rewritten: a Ctrl-C now says so (the command's line said nothing was written)
    with outputs_in_place(f"{escape_controls(path)} is updated"):
        _print_calibration(path, profile, session, grid_fit, args.add)
    return 0


if __name__ == "__main__":
    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
