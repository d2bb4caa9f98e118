"""Probe R, session 31: the prefix router's load-balance fallback. A prefix that every request shares (a system
prompt) sent every request to the one replica that cached it first, without bound, while the others idled (1,500
requests at 300 req/s on 4 replicas: all 1,500 on replica 0, TTFT p50 3.6 s against 0.01 s behind round-robin).
Now, as SGLang's cache-aware router does, a replica more than ``balance_abs_threshold`` (64) unfinished requests above
the least loaded one and more than ``balance_rel_threshold`` (1.5) times its count is passed over for the least
loaded one (the lowest index among equals)."""

from __future__ import annotations

from collections import Counter

import pytest

from sim.config import SimConfig
from sim.router import PrefixAffinityRouter
from sim.simulator import simulate
from tests.engine.helpers import make_engine, params, run_to_completion
from tests.sim.helpers import make_trace

PROMPT = list(range(1, 13))  # three full blocks of make_engine's 4 tokens


def _engine():
    engine, _ = make_engine()
    return engine


def _cache(engine, prompt: list[int]) -> None:
    engine.add_request(prompt, params(max_tokens=1))
    run_to_completion(engine)


def _queue(engine, num_requests: int) -> None:
    for i in range(num_requests):
        engine.add_request([900 + i, 901, 902], params())


@pytest.mark.parametrize(("loads", "expected"), [
    ((64, 0, 0), 0),  # 64 above the least loaded: not more than the threshold, affinity holds
    ((65, 0, 0), 1),  # 65 above: the least loaded, lowest index among equals
    ((65, 1, 0), 2),
    ((105, 41, 41), 0),  # 64 above
    ((106, 41, 41), 1),  # 65 above, and more than 1.5 times 41
    ((205, 140, 150), 0),  # 65 above, but not more than 1.5 times 140 (210)
    ((211, 140, 146), 1),  # 71 above and more than 210
])
def test_a_cached_prefix_is_passed_over_where_its_replica_is_overloaded(loads, expected) -> None:
    engines = [_engine() for _ in loads]
    _cache(engines[0], PROMPT)
    for engine, load in zip(engines, loads):
        _queue(engine, load)
    assert [engine.scheduler.num_unfinished for engine in engines] == list(loads)
    assert PrefixAffinityRouter().route(PROMPT + [50], engines) == expected


def test_the_fallback_compares_with_the_least_loaded_replica_not_the_next_holder() -> None:
    """Two replicas hold the prompt, both overloaded against an idle third: the idle one, not the other holder."""
    engines = [_engine() for _ in range(3)]
    _cache(engines[0], PROMPT)
    _cache(engines[1], PROMPT)
    _queue(engines[0], 80)
    _queue(engines[1], 70)
    assert PrefixAffinityRouter().route(PROMPT, engines) == 2


def test_a_fleet_of_mixed_block_sizes_falls_back_alike() -> None:
    engines = [_engine(), make_engine(block_size=8)[0]]
    _cache(engines[0], PROMPT)
    _queue(engines[0], 65)
    assert PrefixAffinityRouter().route(PROMPT, engines) == 1
    _queue(engines[1], 1)  # 64 above it: affinity holds
    assert PrefixAffinityRouter().route(PROMPT, engines) == 0


def _hot_prefix_trace(num_requests: int, qps: float):
    """Every request: a shared 1,024-token system prompt (64 hash blocks of 16 tokens) and 256 tokens of its own."""
    hash_ids = [list(range(64)) + [1000 + 16 * i + j for j in range(16)] for i in range(num_requests)]
    return make_trace([1280] * num_requests, [200] * num_requests, [i / qps for i in range(num_requests)], hash_ids,
                      hash_block_size=16)


def test_a_hot_prefix_is_spread_over_the_fleet_once_its_replica_is_overloaded() -> None:
    trace = _hot_prefix_trace(600, 300.0)
    result = simulate(trace, SimConfig(num_replicas=4, router="prefix"))
    table = result.requests_table()
    counts = Counter(table["replica"].to_pylist())
    assert sorted(counts) == [0, 1, 2, 3], counts  # was {0: 600}
    assert max(counts.values()) < 300, counts
    # The shared prefix is still reused: every request but the first on each replica hits its 1,024 tokens.
    assert sum(table["cached_tokens"].to_pylist()) >= (600 - 4) * 1024


def test_a_hot_prefix_below_the_threshold_keeps_its_affinity() -> None:
    """A light load (a few dozen requests in flight) stays on the replica that holds the prefix, as before."""
    trace = _hot_prefix_trace(200, 40.0)
    result = simulate(trace, SimConfig(num_replicas=4, router="prefix"))
    assert set(result.requests_table()["replica"].to_pylist()) == {0}


@pytest.mark.parametrize("num_gpu_blocks", [None, 700])
def test_the_fallback_decides_alike_with_fast_forward_on_and_off(num_gpu_blocks) -> None:
    """The fallback reads every replica's queue at each arrival, mid-window where one is lazily applied: the same
    outputs, byte for byte, with fast-forward on and off (700 blocks: KV pressure, preemptions)."""
    trace = _hot_prefix_trace(500, 300.0)
    config = SimConfig(num_replicas=4, router="prefix", num_gpu_blocks=num_gpu_blocks, block_size=16)
    stepped = simulate(trace, config, fast_forward=False)
    forwarded = simulate(trace, config)
    assert len(set(stepped.requests_table()["replica"].to_pylist())) > 1
    assert forwarded.num_fast_forward_steps > 0
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
