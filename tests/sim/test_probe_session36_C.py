"""Session 36, helper C: the prefix router's choice where one replica alone holds the prompt's first block."""

from __future__ import annotations

import pytest

from engine.core.block_manager import BlockManager, prefix_block_hashes
from sim.router import PrefixAffinityRouter
from tests.sim.test_router import PROMPT, _cache, _engine, _queue


@pytest.fixture
def no_counting(monkeypatch):
    """Fail any count of cached prefix blocks: a lone holder's choice must not need one."""

    def refuse(self, block_hashes):
        raise AssertionError("counted the cached blocks of a lone holder")

    monkeypatch.setattr(BlockManager, "num_cached_prefix_blocks", refuse)


def _fleet(queued: list[int], holder: int) -> list:
    engines = []
    for index, num_queued in enumerate(queued):
        engine = _engine()
        _cache(engine, PROMPT if index == holder else [60 + index] * 5)
        _queue(engine, num_queued)
        engines.append(engine)
    return engines


@pytest.mark.parametrize("tracked", [False, True])
def test_a_lone_holder_is_chosen_without_counting_its_blocks_however_loaded(no_counting, tracked) -> None:
    # Replica 2 alone caches PROMPT; it is the most loaded (64 above the least: not overloaded).
    engines = _fleet([3, 0, 64, 5], holder=2)
    router = PrefixAffinityRouter()
    if tracked:  # the simulator's way: the first block's holders from the admissions it is told of
        router.track_admissions(engines)
        router._add_first_block(_first_hash(), 2)  # (what admitted() recorded when replica 2 got PROMPT)
    assert router.route(PROMPT + [99], engines) == 2
    assert router.last_block_hashes[0] == _first_hash()


def test_a_lone_holder_that_is_overloaded_yields_to_the_least_loaded(no_counting) -> None:
    # 65 above the least loaded (replica 1, 0 queued) and more than 1.5 times it: the least loaded one.
    engines = _fleet([3, 0, 65, 0], holder=2)
    assert PrefixAffinityRouter().route(PROMPT, engines) == 1


def test_two_holders_are_still_told_apart_by_their_cached_blocks() -> None:
    # Replica 0 caches PROMPT's first block only, replica 1 all three: more blocks win over a lighter load.
    engines = [_engine(), _engine()]
    _cache(engines[0], PROMPT[:4] + [50])
    _cache(engines[1], PROMPT + [51])
    _queue(engines[1], 2)
    assert PrefixAffinityRouter().route(PROMPT + [99], engines) == 1


def _first_hash() -> int:
    return prefix_block_hashes(PROMPT, 4)[0]
