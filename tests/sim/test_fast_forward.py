"""Fast-forward (engine.core.quiet_window) changes nothing but the speed: with it and without it, the
simulator writes the same request rows and step logs, on configurations where quiet windows actually
occur and requests finish inside them, including preemption-heavy caches, every router, time-varying host
speed and the roofline. With a router that reads the replicas, windows are applied lazily (QuietRun) and the
router sees each replica mid-window as the step loop would have left it."""

from __future__ import annotations

import pytest

from engine.core.quiet_window import QuietRun
from sim import router as routers
from sim import simulator
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT
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


class _RecordingRouter(routers.PrefixAffinityRouter):
    """The prefix router, noting what it read of every replica at each arrival."""

    def __init__(self, views: list) -> None:
        self.views = views

    def route(self, prompt_token_ids, engines) -> int:
        hashes = routers.prefix_block_hashes(prompt_token_ids, engines[0].config.block_size)
        self.views.append([(e.scheduler.num_unfinished, e.scheduler.block_manager.num_cached_prefix_blocks(hashes),
                            e.scheduler.block_manager.num_used_blocks) for e in engines])
        return super().route(prompt_token_ids, engines)


def test_a_router_sees_replicas_mid_window_as_the_step_loop_leaves_them(trace, monkeypatch):
    """At every arrival, each replica's unfinished requests, cached prefix blocks and blocks in use are what the
    step loop has at that instant, though windows are in progress there; and windows were cut by requests routed
    to them, and advanced mid-window through finishes and block events."""
    sliced = trace.head(600).with_qps(20.0)
    config = SimConfig(num_replicas=8, router="prefix", block_size=16)
    stepped_views, forwarded_views = [], []
    monkeypatch.setattr(simulator, "make_router", lambda name: _RecordingRouter(stepped_views))
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
    monkeypatch.setattr(simulator, "make_router", lambda name: _RecordingRouter(forwarded_views))
    result = simulate(sliced, config, fast_forward=True)
    assert len(forwarded_views) == len(sliced)
    assert forwarded_views == stepped_views
    assert result.num_fast_forward_steps > 0.9 * result.steps_table().num_rows
    assert counts["cut"] > len(sliced) // 2
    assert counts["mid-window events"] > len(sliced)
