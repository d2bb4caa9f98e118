"""Which replica an arriving request goes to.

Every router has a ``name`` (the value of ``--router``) and ``route(prompt_token_ids, engines) -> index``;
``ROUTERS`` maps names to classes and ``make_router`` builds one, so a new router is one class plus
one registry entry, and the CLIs' ``--router`` choices follow the registry.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Protocol

from engine.core.block_manager import holders_of_block, prefix_block_hashes, prefix_caches
from engine.core.llm_engine import LLMEngine


class Router(Protocol):
    name: str

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int: ...


class RoundRobinRouter:
    name = "rr"
    # Reads nothing of the engines: where each request goes is known before it arrives, so the simulator lets a
    # replica fast-forward past arrivals routed to the others (a router without this attribute reads them).
    reads_engine_state = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        index = self._next % len(engines)
        self._next += 1
        return index


class LeastOutstandingRouter:
    """Fewest unfinished (waiting + running) requests; ties go to the lowest index."""

    name = "lor"

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        loads = [e.scheduler.num_unfinished for e in engines]
        return loads.index(min(loads))


class PrefixAffinityRouter:
    """Most cached leading blocks of the prompt; ties by fewest unfinished requests, then lowest index; unless that
    replica is overloaded: then the least loaded one (lowest index among equals).

    A multi-turn conversation resends its history, so sending a turn where the earlier turns' KV
    blocks are still cached skips recomputing them. Falling back to least-outstanding keeps prompts
    that share nothing (or that every replica has cached) spread by load rather than piled on one
    replica. "Cached" is what a replica's prefix cache holds now (blocks evicted under KV pressure no
    longer count), every full block of the prompt counted. The prompt is hashed once per block size;
    probing a replica has no side effects.

    Overloaded, as SGLang's cache-aware router's load-balance fallback decides it (its defaults): more than
    ``balance_abs_threshold`` unfinished requests above the least loaded replica and more than
    ``balance_rel_threshold`` times its count. Without it, a prefix every request shares (a system prompt) sent
    every request to the one replica that cached it first, without bound, while the others idled (SGLang checks
    the fleet's most loaded replica; this checks the one the cache picked, so affinity holds wherever it is not
    the overloaded one).
    """

    name = "prefix"
    balance_abs_threshold = 64
    balance_rel_threshold = 1.5

    def __init__(self) -> None:
        # What route reads of a fleet, taken once: a router serves one simulation (made in simulate()), which passes
        # the same list of engines to every call and never resets them (LLMEngine.reset makes a new scheduler); a
        # fleet of 64 built these lists for each request. None: not taken yet; its last entry is the fleet's one
        # block size, or None where they differ.
        self._fleet: tuple | None = None
        # The chained block hashes of the prompt last routed (at the fleet's one block size), None where the replicas'
        # block sizes differ: the simulator hands them to the sequence (LLMEngine.add_request), whose prefix-cache
        # lookup and registration hashed the same blocks again.
        self.last_block_hashes: list[int] | None = None

    def _fleet_of(self, engines: Seq[LLMEngine]) -> tuple:
        fleet = self._fleet
        if fleet is None or fleet[0] is not engines or len(fleet[1]) != len(engines):
            schedulers = [engine.scheduler for engine in engines]
            block_managers = [scheduler.block_manager for scheduler in schedulers]
            block_size = block_managers[0].block_size
            uniform = all(manager.block_size == block_size for manager in block_managers)
            fleet = self._fleet = (engines, schedulers, block_managers, prefix_caches(block_managers),
                                   block_size if uniform else None)
        return fleet

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        _, schedulers, block_managers, caches, block_size = self._fleet_of(engines)
        if block_size is None:
            self.last_block_hashes = None
            return self._balanced(self._route_by_block_size(prompt_token_ids, schedulers), schedulers)
        # One block size (every simulated fleet): the prompt's first block is looked up in every cache in one pass,
        # and only the replicas holding it are probed further; a fleet of 64 spent most of its routing time
        # probing replicas one call at a time (the same choice: most cached blocks, then fewest unfinished, then
        # the lowest index).
        hashes = self.last_block_hashes = prefix_block_hashes(prompt_token_ids, block_size)
        holders = holders_of_block(caches, hashes[0]) if hashes else []
        if not holders:  # no replica has cached a block of it: the least loaded one
            loads = [len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
            return loads.index(min(loads))
        counts = [block_managers[index].num_cached_prefix_blocks(hashes) for index in holders]
        most = max(counts)
        best_index, best_load = -1, 0
        for index, count in zip(holders, counts):  # ascending: an equal load keeps the lower index
            if count == most:
                scheduler = schedulers[index]
                load = len(scheduler.waiting) + len(scheduler.running)  # num_unfinished, without the property's call
                if best_index < 0 or load < best_load:
                    best_index, best_load = index, load
        return self._balanced(best_index, schedulers)

    def _balanced(self, index: int, schedulers: list) -> int:
        """Replica ``index`` (the cache's choice), or the least loaded replica where ``index`` is overloaded."""
        scheduler = schedulers[index]
        load = len(scheduler.waiting) + len(scheduler.running)
        if load <= self.balance_abs_threshold:  # (the least loaded has at least 0: not overloaded, loads unread)
            return index
        loads = [len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
        least = min(loads)
        if load - least > self.balance_abs_threshold and load > self.balance_rel_threshold * least:
            return loads.index(least)
        return index

    @staticmethod
    def _route_by_block_size(prompt_token_ids: list[int], schedulers: list) -> int:
        """The same choice (before the load-balance fallback) for replicas of different block sizes: the prompt hashed
        once per block size."""
        hashes_by_block_size: dict[int, list[int]] = {}
        best_index = 0
        best_cached, best_load = -1, 0
        for index, scheduler in enumerate(schedulers):
            block_manager = scheduler.block_manager
            block_size = block_manager.block_size
            hashes = hashes_by_block_size.get(block_size)
            if hashes is None:
                hashes = hashes_by_block_size[block_size] = prefix_block_hashes(prompt_token_ids, block_size)
            num_cached_blocks = block_manager.num_cached_prefix_blocks(hashes)
            if num_cached_blocks < best_cached:
                continue  # fewer cached blocks never wins: its load is not read
            load = len(scheduler.waiting) + len(scheduler.running)
            # strict: an equal (cached, load) keeps the lower index
            if num_cached_blocks > best_cached or load < best_load:
                best_cached, best_load, best_index = num_cached_blocks, load, index
        return best_index


ROUTERS: dict[str, type] = {cls.name: cls for cls in (RoundRobinRouter, LeastOutstandingRouter, PrefixAffinityRouter)}


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown router {name!r}; supported: {', '.join(ROUTERS)}") from None
