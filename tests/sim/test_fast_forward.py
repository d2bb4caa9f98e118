"""Fast-forward (engine.core.quiet_window) changes nothing but the speed: with it and without it, the
simulator writes the same request rows and step logs, on configurations where quiet windows actually
occur and requests finish inside them, including preemption-heavy caches, every router, time-varying host
speed and the roofline."""

from __future__ import annotations

import pytest

from engine.core.quiet_window import apply_quiet_window
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

    def apply_and_count(*args):
        finished = apply_quiet_window(*args)
        finished_in_windows.extend(finished)
        return finished

    monkeypatch.setattr(simulator, "apply_quiet_window", apply_and_count)
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
