"""Routers: exact decisions on small hand-made engines, and prefix affinity on a multi-turn trace."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.block_manager import prefix_block_hashes
from engine.core.llm_engine import LLMEngine
from sim.router import (
    ROUTERS,
    LeastOutstandingRouter,
    PrefixAffinityRouter,
    RoundRobinRouter,
    make_router,
)
from tests.engine.helpers import make_engine, params, run_to_completion

BLOCK_SIZE = 4  # make_engine's default
PROMPT = list(range(1, 13))  # three full blocks


def _engine() -> LLMEngine:
    engine, _ = make_engine(block_size=BLOCK_SIZE)
    return engine


def _cache(engine: LLMEngine, prompt: list[int]) -> None:
    """Serve `prompt` to completion so its full blocks stay in the engine's prefix cache."""
    engine.add_request(prompt, params(max_tokens=1))
    run_to_completion(engine)


def _queue(engine: LLMEngine, num_requests: int) -> None:
    """Leave `num_requests` unrelated requests waiting (outstanding) on `engine`."""
    for i in range(num_requests):
        engine.add_request([900 + i, 901, 902], params())


def _cached_blocks(engine: LLMEngine, prompt: list[int]) -> int:
    return engine.scheduler.block_manager.num_cached_prefix_blocks(prefix_block_hashes(prompt, BLOCK_SIZE))


def test_registry_lists_prefix_and_errors_name_the_supported_routers() -> None:
    assert set(ROUTERS) == {"rr", "lor", "prefix"}
    assert isinstance(make_router("prefix"), PrefixAffinityRouter)
    with pytest.raises(ValueError, match="supported: rr, lor, prefix"):
        make_router("random")


def test_round_robin_and_least_outstanding() -> None:
    engines = [_engine(), _engine(), _engine()]
    rr = RoundRobinRouter()
    assert [rr.route(PROMPT, engines) for _ in range(4)] == [0, 1, 2, 0]
    _queue(engines[0], 2)
    _queue(engines[1], 1)
    _queue(engines[2], 1)
    assert LeastOutstandingRouter().route(PROMPT, engines) == 1


def test_prefix_goes_where_the_prompt_is_cached_even_if_busier() -> None:
    engines = [_engine(), _engine()]
    _cache(engines[1], PROMPT)
    _queue(engines[1], 3)
    assert _cached_blocks(engines[1], PROMPT) == 3
    assert _cached_blocks(engines[0], PROMPT) == 0
    assert PrefixAffinityRouter().route(PROMPT + [50, 51], engines) == 1


def test_prefix_prefers_the_longest_cached_prefix() -> None:
    engines = [_engine(), _engine(), _engine()]
    _cache(engines[0], PROMPT[:4] + [70, 71, 72, 73])  # shares one block
    _cache(engines[2], PROMPT[:8] + [80, 81, 82, 83])  # shares two blocks
    assert [_cached_blocks(e, PROMPT) for e in engines] == [1, 0, 2]
    assert PrefixAffinityRouter().route(PROMPT, engines) == 2


def test_prefix_ties_go_to_fewest_outstanding_then_lowest_index() -> None:
    engines = [_engine(), _engine(), _engine()]
    router = PrefixAffinityRouter()
    assert router.route(PROMPT, engines) == 0  # nothing cached anywhere, equal loads
    _queue(engines[0], 1)
    assert router.route(PROMPT, engines) == 1  # nothing cached: least outstanding
    _cache(engines[1], PROMPT)
    _cache(engines[2], PROMPT)
    _queue(engines[1], 2)
    _queue(engines[2], 1)
    assert router.route(PROMPT, engines) == 2  # same cached blocks: least outstanding
    _queue(engines[2], 1)
    assert router.route(PROMPT, engines) == 1  # same cached blocks and loads: lowest index


def test_prefix_routes_prompts_shorter_than_a_block_by_load() -> None:
    engines = [_engine(), _engine()]
    _queue(engines[0], 1)
    assert PrefixAffinityRouter().route([5, 6], engines) == 1


def _hit_rate(result) -> float:
    table = result.requests_table()
    return pc.sum(table["cached_tokens"]).as_py() / pc.sum(table["prompt_tokens"]).as_py()


def test_prefix_routing_raises_the_cache_hit_rate_of_a_multi_turn_trace() -> None:
    from sim.config import SimConfig
    from sim.simulator import simulate
    from traces.schema import load_trace

    trace = load_trace(Path(__file__).resolve().parents[2] / "traces" / "sharegpt.parquet").head(1000)
    assert trace.requests["session_id"].n_unique() < len(trace)  # multi-turn: sessions resend history
    rates = {
        router: _hit_rate(simulate(trace, SimConfig(num_replicas=2, router=router)))
        for router in ("rr", "prefix")
    }
    assert rates["prefix"] > rates["rr"] + 0.05, rates


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cached=st.lists(st.lists(st.integers(0, 3), max_size=3), min_size=1, max_size=6),
    queued=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    prompt_blocks=st.integers(0, 3),
)
def test_prefix_routing_of_one_block_size_is_the_general_loops_choice(cached, queued, prompt_blocks) -> None:
    """The one-pass route of a fleet of one block size (first block looked up in every cache, only its holders
    probed) picks what probing every replica in turn picks: most cached blocks, then fewest unfinished, then the
    lowest index, whatever the replicas hold and however loaded they are."""
    prompt = PROMPT[: prompt_blocks * BLOCK_SIZE] + [77]  # a partial last block is never cached
    engines = []
    for index, prompts in enumerate(cached):
        engine = _engine()
        for num_blocks in prompts:  # a prefix of PROMPT of this many blocks, or an unrelated prompt for 0
            _cache(engine, PROMPT[: num_blocks * BLOCK_SIZE] + [50 + index] if num_blocks else [60 + index] * 5)
        _queue(engine, queued[index])
        engines.append(engine)
    router = PrefixAffinityRouter()
    schedulers = [engine.scheduler for engine in engines]
    assert router.route(prompt, engines) == router._route_by_block_size(prompt, schedulers)
