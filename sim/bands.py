"""Prediction bands: seeded replays that vary what repeated GPU runs of one configuration showed to vary.

Two things differ between two GPU runs of the same trace and options (validation/README.md):
- the host's speed: all host code (input preparation, kernel launches) runs up to ~1.75x slower in episodes of
  2 to over 10 s, for 15-35 % of a run's 2-s windows depending on the run. Each band replay draws its own share
  of slow time from that range and its own episodes (``sim.host_speed.HostSpeedEpisodes``), around the same
  average slowdown the main run uses (the profile's calibrated host factor, or ``--host-slowdown``'s number);
- each step's time around the model's prediction, in two parts. The model's error for a step shape (a grid
  point's median over the model's prediction, minus one) is the same for every step of that shape, so it does
  not average out over a run: each band replay draws one such offset per regime (CUDA-graph decode, or
  prefill/mixed) from the profile's points and applies it to all its steps of that regime. The repeat noise
  (each timed repeat over its point's mean, minus one: ``repeat_noise``) is independent per step: each simulated
  step is multiplied by one drawn at random from its regime's pool. (Drawing a whole residual per step, as before,
  averaged the fit's error away: on the piecewise-graph engine the bands were about 1 % wide while the
  simulator was 2-5 % off.) Centred on its point's mean, the noise averages 0 over every point, so it widens
  the band without moving it: the serving calibration already prices the slow repeats (it matches real runs'
  total time), and centred on the median, as before, the right-skewed repeats were counted twice (the H100
  qwen3-0.6b's prefill/mixed pool averaged +4.6 %). Both pools leave out the points a profile marks
  ``timing_artifact`` (``band_points``): a point timed right after the full-batch decode point had freed that
  point's sequences in its timed step (sim.profile, fixed since), at 1.2-3.6x the fit's price, and a replay that
  drew its offset priced every prefill/mixed step so. The fit keeps them, as shipped.

A third thing differs between GPU runs made on different machine starts (another host behind the same GPU model,
another day): the host's average speed, by 5-17 % between two sessions' runs. A profile calibrated on several such
sessions (``sim.calibrate --add``) records each session's own host factor (``serving.sessions``) and prices with
their mean: each band replay then takes one of those sessions' factors as its machine's mean slowdown, each session
equally likely (decode steps follow along the sessions' slope, ``serving.host_share``). The replays' machines thus
average to the mean the main run uses, and no replay runs on a host no session showed. (Drawn uniformly over the
sessions' range, as before, they averaged to the range's middle instead: 0.950 against the mean 0.934 on the H200,
1.217 against 1.235 on the H100.) With one session, or an explicit ``--host-slowdown``, the mean stays fixed.

The band's median still need not sit on the main run. Its machines' median is the median session's, not their
mean (two of the H200's three sessions lie near 0.90, one at 1.00: varied alone, the machines put the latency
medians 1-3 % below the main run on validation slices at ~70 % load), and under load a slower step delays more than
a faster one saves. The pools themselves no longer lean slow (offsets -0.0 to +0.4 % on average per regime, the
repeat noise 0; with the marked points and the median they were +1.8 to +3.5 % and +4.6 %): the 20-replay band
medians of the validation slices at ~70 % load and of the prefill-heavy trace lie within -2.7 to +4.8 % of the main
run on the H100 (up to +21.7 % before) and within -1.1 to +1.4 % on the H200.

``--host-slowdown episodes:...`` keeps the given process and draws new episodes per replay; a measured timeline
(CSV) is kept as it is, and only the residuals vary. A profile's ``serving.host_episodes``
(``{"slow_over_normal", "slow_share_range", "mean_episode_s"}``), when present, replaces the defaults below.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from dataclasses import dataclass

import numpy as np

from engine.core.model_config import ModelShape
from engine.core.scheduler import ScheduledBatch
from sim.config import SimConfig
from sim.cost_model import CostModel
from sim.files import read_json_input
from sim.host_speed import MAX_SLOWDOWN, MIN_SLOWDOWN
from sim.limits import chosen_profile
from sim.profiled_cost_model import ProfiledCostModel, _is_graph_step, measured_values
from traces.token_synth import mix64, mix64_int  # splitmix64's finaliser, on arrays and on ints

# validation/README.md, "Why: the host's speed varies in episodes": eager launch 23.3 ms in slow windows
# against 13.3 ms (1.75x); 15-35 % of 2-s windows over 1.3x across the Azure runs; episodes of 2 to over 10 s.
SLOW_OVER_NORMAL = 1.75
SLOW_SHARE_RANGE = (0.15, 0.35)
MEAN_EPISODE_S = 4.0
SEED_STRIDE = 1 << 20  # a replay's episodes seed offset: replicas add their index below it
# --host-slowdown takes an episodes seed below 2**62: a replay's is taken modulo it, so any replay number (capacity
# --bands numbers them from --seed-offset) and any seed of the user's own episodes make a valid one; both were a
# ValueError traceback past it (--seed-offset 2**63 - 1, episodes:...,2**62 - 1 with --bands).
EPISODES_SEED_LIMIT = 1 << 62
MAX_REPLAYS = 1000


@dataclass(frozen=True)
class BandModel:
    """What the band replays vary, read once from the configuration and its profile."""

    host_mode: str  # "episodes" (drawn per replay around mean_slowdown), "reseed" (the user's episodes) or "fixed"
    mean_slowdown: float
    slow_over_normal: float
    slow_share_range: tuple[float, float]
    mean_episode_s: float
    decode_residuals: np.ndarray | None  # repeat noise, relative: a timed repeat / its point's mean - 1
    eager_residuals: np.ndarray | None
    max_graph_bs: int
    decode_offsets: np.ndarray | None = None  # the model's error per grid point: median / predicted - 1
    eager_offsets: np.ndarray | None = None
    # The calibrated machine sessions' own host factors (None: one session): each replay takes one as its mean
    machine_host_factors: tuple[float, ...] | None = None

    def describe(self) -> dict:
        """What summary.json's ``bands.varied`` says was varied."""
        if self.host_mode == "episodes":
            lo, hi = self.slow_share_range
            machines = self.machine_host_factors
            mean = (f"a mean slowdown drawn per replay from the {len(machines)} calibrated machine sessions' host "
                    f"factors ({', '.join(f'{f:g}' for f in machines)})"
                    if machines else f"a mean slowdown of {self.mean_slowdown:g}")
            host = (f"seeded slow episodes ({self.slow_over_normal:g}x, {lo:.0%}-{hi:.0%} of the time drawn per "
                    f"replay, {self.mean_episode_s:g} s mean) around {mean}")
        elif self.host_mode == "reseed":
            host = "the --host-slowdown episodes, drawn anew per replay"
        else:
            host = "fixed (a measured timeline)"
        if self.decode_residuals is None:
            steps = "not varied (no measured profile)"
        else:
            steps = (f"each replay x (1 + the model's error at one grid point of the regime: "
                     f"{len(self.decode_offsets)} CUDA-graph decode, {len(self.eager_offsets)} prefill/mixed points), "
                     f"each step x (1 + a repeat's deviation from its point's mean: "
                     f"{len(self.decode_residuals)} decode, {len(self.eager_residuals)} prefill/mixed repeats)")
        return {"host_speed": host, "step_times": steps}


def grid_model(fit: dict) -> ProfiledCostModel:
    """A profile's fitted model at the grid's own speed (no serving factors): the conditions its points were
    measured in."""
    return ProfiledCostModel({**fit, "serving": None}, "grid")


def grid_offset(grid: ProfiledCostModel, point: dict) -> float:
    """How much slower grid ``point`` measured than ``grid`` (grid_model) prices it: its median over the price,
    minus one."""
    return point["median_s"] / grid.predict(point["features"], 1.0) - 1.0


def band_points(profile: dict) -> list[dict]:
    """The grid points the bands draw from: the profile's, less those marked ``timing_artifact`` (why the point's time
    is the measurement's, not its step's). One such offset drawn prices every step of its regime in that replay, where
    the fit, made with the point among some hundred, barely moves; the fit keeps them."""
    return [p for p in profile.get("points") or [] if "timing_artifact" not in p]


def repeat_noise(point: dict) -> list[float]:
    """Grid ``point``'s repeat noise: each timed repeat over the repeats' mean, minus one (none for a point without
    a timed repeat). It averages 0 over the point, so a step multiplied by a draw keeps its price on average (the
    module docstring says why the mean and not the median)."""
    times = [t for t in point.get("times_s") or [point["median_s"]] if t > 0]
    if not times:
        return []
    mean_s = math.fsum(times) / len(times)
    return [t / mean_s - 1.0 for t in times]


def _residual_pools(profile: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(decode repeat noise, eager repeat noise, decode offsets, eager offsets, largest decode graph), over
    ``band_points``."""
    fit = profile.get("fit")
    points = band_points(profile)
    if not fit or not points:
        return None
    grid = grid_model(fit)
    noise: dict[bool, list[float]] = {True: [], False: []}
    offsets: dict[bool, list[float]] = {True: [], False: []}
    for p in points:
        is_decode = _is_graph_step(p["features"], grid.max_graph_bs)
        offsets[is_decode].append(grid_offset(grid, p))
        noise[is_decode].extend(repeat_noise(p))
    if not noise[True] or not noise[False]:
        return None
    return (np.array(noise[True]), np.array(noise[False]), np.array(offsets[True]), np.array(offsets[False]),
            grid.max_graph_bs)


def _machine_host_factors(serving: dict) -> tuple[float, ...] | None:
    """The host factors of the machine sessions the profile's host factor is the mean of (sim.calibrate --add's
    ``serving.sessions``, those that measured one); None where they do not differ (one session), as the mean is
    then every replay's."""
    factors = measured_values(serving.get("sessions") or [], "host_factor", lambda s: s["host_factor"])
    return tuple(float(f) for f in factors) if len(set(factors)) > 1 else None


def band_model(config: SimConfig, model: ModelShape) -> BandModel:
    path = chosen_profile(config, model)
    profile = json.loads(read_json_input(path)) if path is not None else {}
    serving = profile.get("serving") or {}
    episodes = serving.get("host_episodes") or {}
    spec = config.host_slowdown.strip()
    machines = None
    if spec == "calibrated":
        mode, mean = "episodes", float(serving.get("host_factor", 1.0))
        machines = _machine_host_factors(serving)
    elif spec.startswith("episodes:"):
        mode, mean = "reseed", 1.0
    else:
        try:
            mode, mean = "episodes", float(spec)
        except ValueError:
            mode, mean = "fixed", 1.0
    pools = _residual_pools(profile) if profile else None
    return BandModel(
        host_mode=mode, mean_slowdown=mean,
        slow_over_normal=float(episodes.get("slow_over_normal", SLOW_OVER_NORMAL)),
        slow_share_range=tuple(episodes.get("slow_share_range", SLOW_SHARE_RANGE)),
        mean_episode_s=float(episodes.get("mean_episode_s", MEAN_EPISODE_S)),
        decode_residuals=pools[0] if pools else None, eager_residuals=pools[1] if pools else None,
        decode_offsets=pools[2] if pools else None, eager_offsets=pools[3] if pools else None,
        max_graph_bs=pools[4] if pools else 0, machine_host_factors=machines,
    )


class PerturbedCostModel:
    """``base``'s step times, each multiplied by 1 + this replay's offset for its regime (drawn once) and by
    1 + a repeat's noise drawn per step from its regime's pool.

    A step's noise is a hash of this replay's key, its replica and its place in that replica's step log
    (``batch.step_index``), not the next draw of a generator: the simulator prices a quiet window's steps ahead,
    some more than once, and a band replay must come out the same with fast-forward on and off."""

    def __init__(self, base: CostModel, bands: BandModel, rng: np.random.Generator) -> None:
        self.base = base
        self.name = base.name
        self._decode, self._eager = bands.decode_residuals, bands.eager_residuals
        self._max_graph_bs = bands.max_graph_bs
        self.decode_scale = 1.0 + float(rng.choice(bands.decode_offsets)) if bands.decode_offsets is not None else 1.0
        self.eager_scale = 1.0 + float(rng.choice(bands.eager_offsets)) if bands.eager_offsets is not None else 1.0
        self._key = int(rng.integers(1 << 63))

    def for_replica(self, index: int) -> PerturbedCostModel:
        """The same replay's model for replica ``index``: the same offsets, its own steps' noise."""
        model = copy.copy(self)
        model._key = mix64_int(self._key ^ index)
        return model

    def _regime(self, batch: ScheduledBatch) -> tuple[np.ndarray, float]:
        if batch.num_prefill_tokens == 0 and 0 < batch.num_decode_seqs <= self._max_graph_bs:
            return self._decode, self.decode_scale
        return self._eager, self.eager_scale

    def step_time_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> float:
        pool, scale = self._regime(batch)
        noise = 1.0 + float(pool[mix64_int(self._key ^ batch.step_index) % len(pool)])
        return self.base.step_time_s(batch, host_slowdown) * scale * noise

    def decode_run_s(self, batch: ScheduledBatch, host_slowdown: float | None = None) -> np.ndarray | None:
        run = getattr(self.base, "decode_run_s", None)
        durations_s = None if run is None else run(batch, host_slowdown)
        if durations_s is None:
            return None
        pool, scale = self._regime(batch)
        index = batch.step_index
        if not isinstance(index, np.ndarray):  # the run's first step: the others follow it
            index = index + np.arange(len(durations_s), dtype=np.int64)
        keys = np.uint64(self._key) ^ index.astype(np.uint64)
        return durations_s * scale * (1.0 + pool[mix64(keys) % np.uint64(len(pool))])


def replay_setup(config: SimConfig, base: CostModel, bands: BandModel, index: int) -> tuple[SimConfig, CostModel]:
    """The configuration and cost model of band replay ``index`` (0-based): a function of --seed and ``index``
    only, so a band is the same whichever process runs which replay."""
    rng = np.random.default_rng([config.seed, index])
    host = config.host_slowdown
    if bands.host_mode == "episodes":
        lo, hi = bands.slow_share_range
        share = float(rng.uniform(lo, hi))
        # normal is set so that the middle of the share range gives the mean slowdown: a replay with more slow
        # time than usual is slower on average, as a GPU run with more episodes is.
        machines = bands.machine_host_factors
        mean = bands.mean_slowdown if machines is None else float(rng.choice(machines))
        normal = mean / (1.0 + (lo + hi) / 2 * (bands.slow_over_normal - 1.0))
        # Held within the host speeds a replay takes: around a mean at their edge (--host-slowdown 0.001 or 1000)
        # the normal or slow periods fell outside, and every band replay failed with a traceback.
        slow = min(max(normal * bands.slow_over_normal, MIN_SLOWDOWN), MAX_SLOWDOWN)
        normal = min(max(normal, MIN_SLOWDOWN), slow)
        host = (f"episodes:{normal:.6g},{slow:.6g},{share:.6g},{bands.mean_episode_s:g},"
                f"{(index + 1) * SEED_STRIDE % EPISODES_SEED_LIMIT}")
    elif bands.host_mode == "reseed":  # the user's process, with the replay's seed added to its own
        parts = host.strip().split(",")
        own = int(parts.pop()) if len(parts) == 5 else 0
        host = ",".join([*parts, str((own + (index + 1) * SEED_STRIDE) % EPISODES_SEED_LIMIT)])
    replay_config = dataclasses.replace(config, host_slowdown=host)
    if bands.decode_residuals is None:
        return replay_config, base
    return replay_config, PerturbedCostModel(base, bands, rng)


def check_num_replays(text: str) -> int:
    """``--bands N``: an integer from 2 to MAX_REPLAYS (ValueError naming the option otherwise)."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not 2 <= value <= MAX_REPLAYS:
        raise ValueError(f"--bands must be an integer from 2 to {MAX_REPLAYS} (the number of seeded replays; a band "
                         f"needs at least two), got {text!r}")
    return value


@functools.lru_cache(maxsize=16)
def _band_inputs(config: SimConfig) -> tuple[CostModel, BandModel]:
    """The base cost model and what the bands vary, read from the profile once per configuration."""
    from sim.simulator import make_cost_model  # the simulator imports this module

    shape = config.model_shape
    return make_cost_model(config, shape), band_model(config, shape)


def band_replay(config: SimConfig, index: int) -> tuple[SimConfig, CostModel]:
    """(config, cost model) of band replay ``index``, built afresh per simulation from cached inputs: its random
    draws restart from the replay's seed, so every simulation of one replay (a capacity search's QPS points)
    sees the same perturbed deployment, whatever order they run in."""
    base, bands = _band_inputs(config)
    return replay_setup(config, base, bands, index)
