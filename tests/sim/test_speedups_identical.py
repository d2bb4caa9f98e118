"""The simulator's other speed-ups change nothing but the speed, byte for byte: prompts kept as int32 arrays
instead of lists, and a quiet window's step times computed as arrays instead of one call per step."""

from __future__ import annotations

import math

import pytest

from engine.core.model_config import ModelShape
from engine.core.scheduler import ScheduledBatch
from sim.config import SimConfig
from sim.cost_model import RooflineCostModel
from sim.hardware import get_gpu
from sim.host_speed import ConstantHostSpeed, HostSpeedEpisodes, HostSpeedTimeline
from sim.profiled_cost_model import ProfiledCostModel, find_profile
from sim.runner import CostModelRunner
from sim.simulator import SimClock, SimEnvironment, simulate
from tests.sim.helpers import SHAREGPT, FixedClock, decode_only_batch
from traces.requests import TraceRequests
from traces.schema import load_trace

CASES = {
    "prefix router": {"num_replicas": 3, "router": "prefix", "block_size": 16},
    "preemptions": {"num_gpu_blocks": 60, "block_size": 16, "max_num_seqs": 32},
    "nano, no prefix caching": {"policy": "nano", "enable_prefix_caching": False},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_array_prompts_give_the_outputs_of_list_prompts(case, monkeypatch):
    trace = load_trace(SHAREGPT).head(400).with_qps(20.0)
    config = SimConfig(**CASES[case])
    with_arrays = simulate(trace, config)
    monkeypatch.setattr(TraceRequests, "prompt_array", TraceRequests.prompt)  # the lists the engine replay queues
    with_lists = simulate(trace, config)
    assert with_arrays.requests_table().equals(with_lists.requests_table())
    assert with_arrays.steps_table().equals(with_lists.steps_table())
    if config.enable_prefix_caching:  # cached_tokens: prefix hits were compared too
        assert sum(row[8] for row in with_lists.request_rows) > 0


def test_the_engines_clock_reads_the_simulated_time():
    """The environment's ``now`` and the engines' clock read in C (SimEnvironment.now, SimClock): the time simpy's own
    loop and the fast event loop set, as simpy's property read it."""
    env = SimEnvironment()
    clock = SimClock(env)
    assert env.now == clock.now() == 0.0
    env.run(until=2.5)  # simpy's own loop
    assert env.now == clock.now() == 2.5
    env.timeout(0.25)
    env.run()  # SimEnvironment's loop
    assert env.now == clock.now() == 2.75
    assert type(clock.now()) is float


def _cost_model(kind: str):
    if kind == "profiled":
        return ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    return RooflineCostModel(ModelShape.load("qwen3-8b"), get_gpu("h200"))




@pytest.mark.parametrize("host", [None, 1.7])
@pytest.mark.parametrize("kind", ["profiled", "roofline"])
@pytest.mark.parametrize("num_seqs, context, longest", [(1, 900, 900), (37, 20_000, 3_000), (256, 400_000, 9_000)])
def test_quiet_step_ends_equal_the_step_by_step_sums(kind, host, num_seqs, context, longest):
    cost_model = _cost_model(kind)
    runner = CostModelRunner(cost_model, host_speed=None if host is None else ConstantHostSpeed(host),
                             clock=FixedClock(0.0))

    def batch() -> ScheduledBatch:
        return decode_only_batch(num_seqs, context, longest)

    start_s = 12.345678
    for max_steps, horizon_s in ((3, float("inf")), (5000, float("inf")), (5000, 13.0), (70_000, 40.0)):
        vectorised = runner.quiet_step_ends_s(batch(), start_s, max_steps, horizon_s).tolist()
        one_by_one = runner._step_ends_one_by_one(batch(), start_s, max_steps, horizon_s)
        assert vectorised == one_by_one  # the same floats, not merely close ones
        assert 0 < len(one_by_one) <= max_steps
        assert all(end < horizon_s for end in one_by_one)
        # Crossing the horizon: the same steps and the one in progress at the horizon, if max_steps allows it.
        crossed = runner.quiet_step_ends_s(batch(), start_s, max_steps, horizon_s, cross_horizon=True).tolist()
        assert crossed == runner._step_ends_one_by_one(batch(), start_s, max_steps, horizon_s, cross_horizon=True)
        if len(one_by_one) < max_steps:
            longer = runner._step_ends_one_by_one(batch(), start_s, len(one_by_one) + 1, math.inf)
            assert crossed == longer and crossed[-1] >= horizon_s
        else:
            assert crossed == one_by_one



@pytest.mark.parametrize("host", [None, 1.7])
@pytest.mark.parametrize("num_seqs, context, longest", [(1, 900, 900), (37, 20_000, 3_000), (256, 400_000, 9_000),
                                                        (300, 400_000, 9_000)])
def test_quiet_segment_ends_equal_the_quiet_step_ends(host, num_seqs, context, longest):
    """quiet_segment_ends_s (a segment given by its numbers, its passes sized by the last step priced) gives the very
    floats of quiet_step_ends_s on the batch, with and without crossing the horizon, whatever its guess at a step's
    length (first, short, long); None where the batch is no CUDA-graph decode (quiet_step_ends_s prices it)."""
    cost_model = _cost_model("profiled")

    def runner() -> CostModelRunner:
        return CostModelRunner(cost_model, host_speed=None if host is None else ConstantHostSpeed(host),
                               clock=FixedClock(0.0))

    start_s = 12.345678
    for guess_s in (None, 1e-6, 1.0):
        by_numbers = runner()
        if guess_s is not None:
            by_numbers._guess_s = guess_s
        for continues in (0, 1):
            for max_steps, horizon_s in ((3, math.inf), (5000, math.inf), (5000, 13.0), (70_000, 40.0), (40, 12.35)):
                for cross_horizon in (False, True):
                    batch = decode_only_batch(num_seqs, context, longest)
                    batch.continues_batch = continues
                    expected = runner().quiet_step_ends_s(batch, start_s, max_steps, horizon_s, cross_horizon)
                    got = by_numbers.quiet_segment_ends_s(num_seqs, context, longest, continues, start_s, max_steps,
                                                          horizon_s, cross_horizon)
                    if num_seqs > cost_model.max_graph_bs:
                        assert got is None
                    else:
                        assert got.tolist() == expected.tolist(), (guess_s, continues, max_steps, horizon_s)


@pytest.mark.parametrize("sampling", ["greedy", "temperature", "filters"])
@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_decode_run_from_the_first_step_equals_step_time_step_by_step(model_name, sampling):
    """decode_run_from_s (the contexts built by the model, its arithmetic in place on 0-d coefficients) gives the
    very floats of step_time_s step by step: a first step that does not continue its batch, the skew term (large
    batches, long and short longest contexts), sampling's extra, host slowdowns."""
    model = ProfiledCostModel.load(find_profile(model_name, "h200"), sampling=sampling)
    cases = [(bs, bs * context, longest, continues, num_steps, slowdown)
             for bs in (1, 7, 31, 32, 33, 100, 256) for context, longest in ((900, 950), (3_000, 12_000), (5, 3))
             for continues in (0, 1) for num_steps, slowdown in ((1, None), (13, 0.7), (300, None), (64, 1.3))]
    for bs, context, longest, continues, num_steps, slowdown in cases:
        batch = decode_only_batch(bs, context, longest)
        batch.continues_batch = continues
        run = model.decode_run_from_s(batch, num_steps, slowdown).tolist()
        one_by_one = []
        for k in range(num_steps):
            batch.decode_context_tokens, batch.max_decode_context_tokens = context + bs * k, longest + k
            batch.continues_batch = continues if k == 0 else 1
            one_by_one.append(model.step_time_s(batch, slowdown))
        assert run == one_by_one, (bs, context, longest, continues, num_steps, slowdown)


_TIME_VARYING_HOSTS = {  # a fresh one per run: episodes are drawn as they are asked for
    "episodes of 4 s": lambda: HostSpeedEpisodes(1.0, 1.6, 0.25, 4.0, seed=3),
    "episodes of 20 ms": lambda: HostSpeedEpisodes(0.9, 1.5, 0.4, 0.02, seed=5),
    "episodes of 1 ms": lambda: HostSpeedEpisodes(0.9, 1.2, 0.5, 0.001, seed=7),
    "timeline": lambda: HostSpeedTimeline([0.0, 12.40, 12.400001, 12.9, 30.0], [1.0, 1.4, 0.8, 1.2, 1.7]),
}


@pytest.mark.parametrize("host", sorted(_TIME_VARYING_HOSTS))
@pytest.mark.parametrize("kind", ["profiled", "roofline"])
@pytest.mark.parametrize("num_seqs, context, longest", [(1, 900, 900), (37, 20_000, 3_000)])
def test_quiet_step_ends_with_a_varying_host_equal_the_step_by_step_sums(kind, host, num_seqs, context, longest):
    """A host speed that varies is priced in array passes too, one per stretch of constant speed (each step at its
    start's slowdown): the same floats as one call per step, which every such run took before."""
    cost_model = _cost_model(kind)

    def runner() -> CostModelRunner:
        return CostModelRunner(cost_model, host_speed=_TIME_VARYING_HOSTS[host](), clock=FixedClock(12.0))

    def batch() -> ScheduledBatch:
        return decode_only_batch(num_seqs, context, longest)

    start_s = 12.345678
    for max_steps, horizon_s in ((3, float("inf")), (5000, float("inf")), (5000, 13.0), (20_000, 40.0)):
        for cross_horizon in (False, True):
            vectorised = runner().quiet_step_ends_s(batch(), start_s, max_steps, horizon_s, cross_horizon).tolist()
            one_by_one = runner()._step_ends_one_by_one(batch(), start_s, max_steps, horizon_s, cross_horizon)
            assert vectorised == one_by_one  # the same floats, not merely close ones
    if host in ("episodes of 4 s", "timeline"):  # stretches of many steps: priced in passes, not a call per step
        calls = []
        model = runner()
        model.duration_at = lambda batch, start_s: calls.append(start_s) or cost_model.step_time_s(
            batch, model.host_speed.slowdown_at(start_s))
        model.quiet_step_ends_s(batch(), start_s, 5000, float("inf"))
        assert len(calls) < 500


@pytest.mark.parametrize("options", [{}, {"block_size": 16, "num_gpu_blocks": 400},
                                     {"enable_prefix_caching": False, "block_size": 16}])
def test_large_batches_schedule_as_the_general_path_does(options, monkeypatch):
    from engine.core.scheduler import Scheduler

    trace = load_trace(SHAREGPT).head(600).with_qps(43.0)  # near capacity: batches of a hundred and more
    config = SimConfig(**options)
    fast = simulate(trace, config)
    monkeypatch.setattr(Scheduler, "steady_plain_decodes", False)  # every row looked at, every step
    inlined = simulate(trace, config)
    monkeypatch.setattr(Scheduler, "inline_plain_decodes", False)  # the real loop, every sequence via append_slots
    general = simulate(trace, config)
    assert fast.requests_table().equals(inlined.requests_table())
    assert fast.steps_table().equals(inlined.steps_table())
    assert fast.requests_table().equals(general.requests_table())
    assert fast.steps_table().equals(general.steps_table())
    if "num_gpu_blocks" in options:  # a small cache: the general path's preemptions were met
        assert sum(general.requests_table().column("num_preemptions").to_pylist()) > 0
    else:
        assert max(fast.steps_table().column("num_seqs").to_pylist()) > 100


@pytest.mark.parametrize("case", ["round robin", "prefix router", "nano", "preemptions"])
def test_token_times_kept_as_step_ends_give_the_same_requests(case, monkeypatch):
    """A finished request's token times kept as a run of its replica's step ends (sim.simulator.StepEnds) read
    back as the very floats it got; requests whose tokens skip steps (preempted ones, the nano policy's decodes
    during prefill steps) keep their own arrays."""
    from sim import simulator

    configs = {
        "round robin": {"num_replicas": 3, "router": "rr"},
        "prefix router": {"num_replicas": 3, "router": "prefix"},
        "nano": {"policy": "nano"},
        "preemptions": {"num_gpu_blocks": 60, "block_size": 16, "max_num_seqs": 32},
    }
    trace = load_trace(SHAREGPT).head(400).with_qps(20.0)
    config = SimConfig(**configs[case])
    compact = simulate(trace, config)
    monkeypatch.setattr(simulator, "compact_token_times", lambda row, ends_s: row)
    kept = simulate(trace, config)
    assert compact.requests_table().equals(kept.requests_table())
    spans = [row for row in compact.request_rows if isinstance(row[-1], simulator.StepEnds)]
    long_enough = [row for row in kept.request_rows if len(row[-1]) >= simulator._MIN_STEP_ENDS_TOKENS]
    if case == "preemptions":  # the preempted ones are not runs of steps; the others are
        preempted = [row for row in long_enough if row[9] > 0]
        assert preempted and len(spans) == len(long_enough) - len(preempted)
    elif case == "nano":  # decodes wait during prefill steps: only requests that met none are runs
        assert 0 < len(spans) < len(long_enough)
    else:
        assert len(spans) == len(long_enough)


LAZY_CASES = {
    "overloaded": {},
    "overloaded, preemptions": {"num_gpu_blocks": 2400, "block_size": 16},
    "prefix router": {"num_replicas": 3, "router": "prefix"},
    "least outstanding": {"num_replicas": 2, "router": "lor"},
    "round robin": {"num_replicas": 2, "router": "rr"},
    "nano": {"policy": "nano"},
    "stopped early": {},
}


@pytest.mark.parametrize("case", sorted(LAZY_CASES))
def test_lazy_tokens_give_the_outputs_of_tokens_appended_each_step(case, monkeypatch):
    """A large batch's plain rows owing their tokens while requests wait (engine.core.steady_decodes, lazy tokens)
    change no output, byte for byte: overloaded replicas (every step with a queue), preemptions, every router, the
    nano policy, and a run a watch stops while sequences still owe (their rows are written unfinished)."""
    from analysis.capacity.certain_miss import CertainMiss
    from analysis.slo import SLO
    from engine.core.steady_decodes import SteadyDecodes

    trace = load_trace(SHAREGPT).head(700).with_qps(150.0)  # past saturation: requests queue, batches are large
    config = SimConfig(**LAZY_CASES[case])

    def run(lazy_tokens: bool):
        watch = None
        if case == "stopped early":
            watch = CertainMiss(trace.requests["arrival_s"].to_numpy(), 0.0, 1e9, [SLO("ttft", "p90", 0.5)])
        return simulate(trace, config, lazy_tokens=lazy_tokens, watch=watch)

    logged = []
    log_step = SteadyDecodes.log_step
    monkeypatch.setattr(SteadyDecodes, "log_step", lambda self, *args: (logged.append(1), log_step(self, *args)))
    lazy = run(True)
    num_lazy_steps = len(logged)
    assert num_lazy_steps > 20  # the lazy steps were taken
    eager = run(False)
    assert len(logged) == num_lazy_steps  # none more: the flag is off
    assert lazy.requests_table().equals(eager.requests_table())
    assert lazy.steps_table().equals(eager.steps_table())
    if case == "stopped early":
        assert lazy.stopped_s is not None and lazy.stopped_s == eager.stopped_s
        unfinished = [row for row in lazy.request_rows if row[_finish_column()] is None]
        assert unfinished  # in flight when it stopped, some of them owing tokens until written
    if "num_gpu_blocks" in LAZY_CASES[case]:
        assert sum(lazy.requests_table().column("num_preemptions").to_pylist()) > 0


def _finish_column() -> int:
    from engine.core.records import REQUEST_COLUMNS

    return [c.name for c in REQUEST_COLUMNS].index("finish_s")


@pytest.mark.parametrize("host_slowdown", ["episodes:1,1.6,0.25,4", "episodes:0.9,1.5,0.4,0.02"])
@pytest.mark.parametrize("band", [None, 2], ids=["replay", "band-replay"])
def test_windows_under_a_varying_host_give_the_step_by_step_outputs(host_slowdown, band):
    """Whole runs, windows priced per stretch of host speed against the step loop, on two replicas behind the
    prefix router, at a light load (long windows) and a heavy one; a band replay adds per-step noise keyed by the
    step's place in its log."""
    from sim.bands import band_replay

    config = SimConfig(num_replicas=2, router="prefix", host_slowdown=host_slowdown)
    cost_model = None
    if band is not None:
        config, cost_model = band_replay(config, band)
    for qps in (2.0, 30.0):
        trace = load_trace(SHAREGPT).head(300).with_qps(qps)
        windows = simulate(trace, config, cost_model=cost_model)
        steps = simulate(trace, config, cost_model=cost_model, fast_forward=False)
        assert windows.requests_table().equals(steps.requests_table())
        assert windows.steps_table().equals(steps.steps_table())


@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_eager_parts_with_floors_kept_per_row_equal_the_dot_products(model_name):
    """ProfiledCostModel keeps each eager row's host floor: asked again, and for a row whose counts are equal but
    typed otherwise, it gives np.dot's very float."""
    import numpy as np

    from sim.profiled_cost_model import _floor_row, _sum_floor_row

    model = ProfiledCostModel.load(find_profile(model_name, "h200"))
    row_of = _sum_floor_row if model.eager_form == "sum" else _floor_row
    for _ in range(2):  # computed, then kept
        for num_seqs in (1, 2, 7, 256):
            for num_prefill in (0, 1, 3):
                for num_decode in (0, 5):
                    f = {"num_seqs": num_seqs, "num_prefill_seqs": num_prefill, "num_decode_seqs": num_decode,
                         "num_prefill_tokens": 300, "prefill_context_tokens": 40, "decode_context_tokens": 9_000,
                         "prefill_attention_pairs": 50_000, "max_decode_context_tokens": 4_000}
                    expected = _left_to_right_dot(model._floor_coef, row_of(f))
                    _assert_near_np_dot(expected, model._floor_coef, row_of(f))
                    for features in (f, dict(f), {**f, "num_seqs": np.int64(num_seqs)}):
                        assert model.eager_parts(features)[0] == expected


@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_eager_device_parts_are_left_to_right_sums_near_the_dot_products(model_name):
    """An eager step's device part is its products summed one by one, left to right from 0.0 (rows of every
    magnitude a step's features take: tokens to 2**20, attention pairs to 2**40), and np.dot's up to rounding. (Equal
    to np.dot's very float where OpenBLAS sums so few terms without fused multiply-adds, as on the machines the
    identity runs used; a BLAS that fuses them may differ in the last bit, which the sum no longer depends on.)"""
    import random

    from sim.profiled_cost_model import _gpu_row, _sum_gpu_row

    model = ProfiledCostModel.load(find_profile(model_name, "h200"))
    rng = random.Random(0)
    for _ in range(20_000):
        tokens = rng.randrange(1, 2**rng.randrange(1, 21))
        f = {"num_seqs": rng.randrange(1, 257), "num_prefill_seqs": 1, "num_decode_seqs": rng.randrange(0, 256),
             "num_prefill_tokens": tokens, "prefill_context_tokens": rng.randrange(0, 2**rng.randrange(1, 21)),
             "decode_context_tokens": rng.randrange(0, 2**rng.randrange(1, 25)),
             "prefill_attention_pairs": rng.randrange(0, 2**rng.randrange(1, 41))}
        row = (_sum_gpu_row(f, model._piecewise_sizes, model._tokens_knot) if model.eager_form == "sum"
               else _gpu_row(f))
        device_s = model.eager_parts(f)[1]
        assert type(device_s) is float
        assert device_s == _left_to_right_dot(model._gpu_coef, row)
        _assert_near_np_dot(device_s, model._gpu_coef, row)


def _left_to_right_dot(coefficients, row) -> float:
    total = 0.0
    for coefficient, value in zip(coefficients, row, strict=True):
        total += coefficient * value
    return total


def _assert_near_np_dot(value: float, coefficients, row) -> None:
    """np.dot's float, up to the last bits of the largest products (a BLAS may sum or fuse them otherwise)."""
    import numpy as np

    scale = sum(abs(coefficient * element) for coefficient, element in zip(coefficients, row, strict=True))
    assert abs(value - float(np.dot(np.array(coefficients), row))) <= 1e-12 * scale
