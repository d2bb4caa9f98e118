"""Fast-forward (engine.core.quiet_window) changes nothing but the speed: with it and without it, the
simulator writes the same request rows and step logs, on configurations where quiet windows actually
occur and requests finish inside them, including preemption-heavy caches, every router, time-varying host
speed and the roofline. With a router that reads the replicas, windows are applied lazily (QuietRun) and the
router sees each replica mid-window as the step loop would have left it."""

from __future__ import annotations

import pytest

from engine.core.quiet_window import QuietRun
from sim import simulator
from sim.bands import PerturbedCostModel, band_replay
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT, RecordingPrefixRouter
from traces.schema import load_trace

CASES = {
    "default": {},
    "nano": {"policy": "nano"},
    "preemptions, nano, prefix router": {"num_gpu_blocks": 40, "block_size": 16, "policy": "nano",
                                         "num_replicas": 2, "router": "prefix"},
    "preemptions, small blocks": {"num_gpu_blocks": 60, "block_size": 16, "max_num_seqs": 32},
    "preemptions, big blocks": {"num_gpu_blocks": 30, "max_num_seqs": 32},
    "least outstanding router": {"num_replicas": 3, "router": "lor"},
    "round robin": {"num_replicas": 3, "router": "rr"},
    # Windows run past the arrivals routed to other replicas; requests none can serve are never routed.
    "round robin, 8 replicas, rejections": {"num_replicas": 8, "router": "rr", "max_model_len": 1024},
    "prefix router": {"num_replicas": 3, "router": "prefix"},
    # Many replicas behind a router that reads them: windows end at each replica's own next request.
    "prefix router, 8 replicas, small blocks": {"num_replicas": 8, "router": "prefix", "block_size": 16},
    "no prefix caching": {"enable_prefix_caching": False, "block_size": 16},
    "host speed episodes": {"host_slowdown": "episodes:1.0,1.8,0.3,2.0"},
    "roofline": {"cost_model": "roofline", "model": "qwen3-8b"},
    # Chunked prompts whose last token is computed alone: a decode-shaped row that samples the first token.
    "small token budget": {"max_num_batched_tokens": 257},
}


@pytest.fixture(scope="module")
def trace():
    return load_trace(SHAREGPT)


@pytest.mark.parametrize("mode", ["online", "offline"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_are_identical_with_and_without_fast_forward(trace, case, mode, monkeypatch):
    sliced = trace.head(600).with_qps(20.0) if mode == "online" else trace.head(300).offline()
    config = SimConfig(**CASES[case])
    stepped = simulate(sliced, config, fast_forward=False)
    finished_in_windows = []
    advance = QuietRun.advance

    def advance_and_count(run, t_s):  # every finish of a window is applied here (QuietRun.finish calls it)
        finished = advance(run, t_s)
        finished_in_windows.extend(finished)
        return finished

    monkeypatch.setattr(QuietRun, "advance", advance_and_count)
    forwarded = simulate(sliced, config, fast_forward=True)
    assert stepped.num_fast_forward_steps == 0
    total_steps = stepped.steps_table().num_rows
    # Windows occurred (under KV pressure the queue is rarely empty, so there are fewer of them).
    assert forwarded.num_fast_forward_steps > (100 if case.startswith("preemptions") else total_steps // 4)
    # Requests finished inside windows (their finishing steps applied in bulk, blocks freed mid-window).
    assert len(finished_in_windows) > (0 if case.startswith("preemptions") else len(sliced) // 10)
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
    if case.startswith("preemptions"):
        assert sum(row[9] for row in stepped.request_rows) > 0  # num_preemptions: the windows met KV pressure


def test_a_router_sees_replicas_mid_window_as_the_step_loop_leaves_them(trace, monkeypatch):
    """At every arrival, each replica's unfinished requests, cached prefix blocks and blocks in use are what the
    step loop has at that instant, though windows are in progress there; and windows were cut by requests routed
    to them, and advanced mid-window through finishes and block events."""
    sliced = trace.head(600).with_qps(20.0)
    config = SimConfig(num_replicas=8, router="prefix", block_size=16)
    stepped_views, forwarded_views = [], []
    monkeypatch.setattr(simulator, "make_router", lambda name: RecordingPrefixRouter(stepped_views))
    simulate(sliced, config, fast_forward=False)

    counts = {"cut": 0, "mid-window events": 0}
    cut, advance = QuietRun.cut, QuietRun.advance

    def cut_and_count(run, t_s):
        was_cut = cut(run, t_s)
        counts["cut"] += was_cut
        return was_cut

    def advance_and_count(run, t_s):
        before = run._next
        finished = advance(run, t_s)
        if t_s < run.window.end_s:
            counts["mid-window events"] += run._next - before
        return finished

    monkeypatch.setattr(QuietRun, "cut", cut_and_count)
    monkeypatch.setattr(QuietRun, "advance", advance_and_count)
    monkeypatch.setattr(simulator, "make_router", lambda name: RecordingPrefixRouter(forwarded_views))
    result = simulate(sliced, config, fast_forward=True)
    assert len(forwarded_views) == len(sliced)
    assert forwarded_views == stepped_views
    assert result.num_fast_forward_steps > 0.9 * result.steps_table().num_rows
    assert counts["cut"] > len(sliced) // 2
    assert counts["mid-window events"] > len(sliced)


def _with_arrivals(trace, times_s: list[float]):
    """``trace`` with one more request (a short prompt of its own, two output tokens) at each of ``times_s``."""
    import polars as pl

    from traces.schema import Trace

    frame = trace.requests
    extra = pl.DataFrame({"request_id": [10_000 + i for i in range(len(times_s))], "arrival_s": times_s,
                          "prompt_tokens": [40] * len(times_s), "output_tokens": [2] * len(times_s),
                          "hash_ids": [[900_000 + 3 * i + k for k in range(3)] for i in range(len(times_s))],
                          "session_id": [-1] * len(times_s), "turn": [0] * len(times_s)}, schema=frame.schema)
    return Trace.from_frame(pl.concat([frame, extra]).sort("arrival_s", maintain_order=True), "mem",
                            trace.hash_block_size)


def test_a_window_takes_the_step_a_request_arrives_in_but_not_one_that_ends_as_another_arrives(trace, monkeypatch):
    """The step loop runs a decode step that starts before a request arrives to its end, and the request's prefill
    after it: a window (one replica, a router that reads nothing) holds that step too, its last row counting the
    request waiting. When another request arrives exactly as that step ends, which comes first is simpy's choice:
    the window stops before the step. Both ways the outputs are the step loop's."""
    sliced = trace.head(200).with_qps(10.0)
    config = SimConfig()
    stepped = simulate(sliced, config, fast_forward=False).steps_table().to_pylist()
    arrivals = sorted(sliced.requests["arrival_s"].to_list())
    # A quiet decode step well clear of every arrival: a request will arrive in its middle, another at its end.
    quiet = next(r for r in stepped[50:] if r["num_prefill_tokens"] == 0 and r["num_waiting"] == 0
                 and r["num_seqs"] > 2 and not any(r["start_s"] - 0.05 < a < r["start_s"] + r["duration_s"] + 0.05
                                                   for a in arrivals))
    start_s, end_s = quiet["start_s"], quiet["start_s"] + quiet["duration_s"]
    plans = []
    plan = simulator.plan_quiet_window

    def plan_and_note(engine, token_id, step_ends, start, horizon, **kwargs):
        planned = plan(engine, token_id, step_ends, start, horizon, **kwargs)
        if planned is not None:
            plans.append((kwargs.get("cross_horizon", False), planned[0].end_s, horizon))
        return planned

    monkeypatch.setattr(simulator, "plan_quiet_window", plan_and_note)
    for times in ([(start_s + end_s) / 2], [(start_s + end_s) / 2, end_s]):
        plans.clear()
        changed = _with_arrivals(sliced, times)
        forwarded = simulate(changed, config)
        step_by_step = simulate(changed, config, fast_forward=False)
        assert forwarded.requests_table().equals(step_by_step.requests_table())
        assert forwarded.steps_table().equals(step_by_step.steps_table())
        # the windows planned up to the first added request: the one that took the step it arrives in ...
        up_to_it = [p for p in plans if p[2] == times[0]]
        assert up_to_it[0][:2] == (True, end_s)
        if len(times) == 1:
            assert len(up_to_it) == 1
        else:  # ... planned again without it, the second request arriving exactly at that step's end
            assert len(up_to_it) == 2 and not up_to_it[1][0] and up_to_it[1][1] < times[0]
    # Windows crossed their horizon on the trace's own arrivals too.
    assert sum(1 for cross, end, horizon in plans if cross and end > horizon) > 10


BAND_CASES = {
    "default": {},
    "least outstanding router": {"num_replicas": 3, "router": "lor"},
    "preemptions, prefix router": {"num_gpu_blocks": 60, "block_size": 16, "max_num_seqs": 32, "num_replicas": 2,
                                   "router": "prefix"},
    "round robin": {"num_replicas": 2, "router": "rr"},
}


@pytest.mark.parametrize("case", sorted(BAND_CASES))
def test_band_replays_are_identical_with_and_without_fast_forward(trace, case):
    # A band replay draws each step's noise: keyed on the replica and the step's place in its log, not drawn in the
    # order steps are priced (a window prices its steps ahead, some more than once), it comes out the same.
    sliced = trace.head(600).with_qps(20.0)
    for index in (0, 7):
        config, cost_model = band_replay(SimConfig(**BAND_CASES[case]), index)
        assert isinstance(cost_model, PerturbedCostModel)
        stepped = simulate(sliced, config, cost_model=cost_model, fast_forward=False)
        forwarded = simulate(sliced, config, cost_model=cost_model, fast_forward=True)
        assert forwarded.num_fast_forward_steps > 100
        assert forwarded.requests_table().equals(stepped.requests_table())
        assert forwarded.steps_table().equals(stepped.steps_table())
