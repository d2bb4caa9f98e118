"""Which replica an arriving request goes to.

Every router has a ``name`` (the value of ``--router``) and ``route(prompt_token_ids, engines) -> index``;
``ROUTERS`` maps names to classes and ``make_router`` builds one, so a new router is one class plus
one registry entry, and the CLIs' ``--router`` choices follow the registry. A router that reads the replicas may
also take ``track_admissions(engines)`` and ``admitted(index, seq)``: the simulator, through which every request
reaches its fleet, then tells it each sequence it adds where (the prefix router follows its first blocks so).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence as Seq
from typing import Protocol

from engine.core.block_manager import holders_of_block, prefix_block_hashes, prefix_caches
from engine.core.llm_engine import LLMEngine
from engine.core.sequence import Sequence


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


class LoadTracking:
    """Every replica's unfinished requests (waiting + running), for a router that reads them all: read one by one,
    or, for a caller that says which replicas' queues may have changed (``track_loads``), kept and read again only for
    those. A fleet of 64 read all 64 for a request where two or three had changed (the prefix router, for the ~45 % of
    requests whose first block no replica holds): the 64-replica benchmark's first 5,000 sessions took 3.333e9
    instructions, 3.263e9 (-2.1 %) so."""

    # With track_loads: each replica's unfinished requests as of the last read, the replicas whose queues may have
    # changed since (the caller's to fill), and the fleet's schedulers. None: not tracked.
    _loads: list[int] | None = None
    _stale_loads: set[int]
    _load_schedulers: list

    def track_loads(self, engines: Seq[LLMEngine]) -> set[int]:
        """For a caller that adds to the returned set the index of every replica of ``engines`` whose queues (waiting,
        running) may have changed, before the next ``route``, and passes ``route`` these same engines (never reset:
        LLMEngine.reset makes a new scheduler): route then reads only those replicas' queues where it needs every
        replica's load."""
        self._load_schedulers = schedulers = [engine.scheduler for engine in engines]
        self._loads = [len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
        self._stale_loads = set()
        return self._stale_loads

    def _fleet_loads(self, schedulers: list) -> list[int]:
        """Every replica's unfinished requests now (``num_unfinished``), by replica, of ``schedulers`` (the engines'
        in order); not to be changed."""
        loads = self._loads
        if loads is None:
            return [len(scheduler.waiting) + len(scheduler.running) for scheduler in schedulers]
        stale = self._stale_loads
        for index in stale:
            scheduler = schedulers[index]
            loads[index] = len(scheduler.waiting) + len(scheduler.running)
        stale.clear()
        return loads


class LeastOutstandingRouter(LoadTracking):
    """Fewest unfinished (waiting + running) requests; ties go to the lowest index."""

    name = "lor"

    def route(self, prompt_token_ids: list[int], engines: Seq[LLMEngine]) -> int:
        if self._loads is None:
            loads = [e.scheduler.num_unfinished for e in engines]
        else:
            loads = self._fleet_loads(self._load_schedulers)
        return loads.index(min(loads))


class PrefixAffinityRouter(LoadTracking):
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
        # With track_admissions: first-block hash -> the replicas (ascending) given a sequence whose first block has
        # that hash. None: not tracked (every replica's cache is probed).
        self._first_block_replicas: dict[int, list[int]] | None = None
        # Tracked sequences admitted with a prompt shorter than a block, (replica, sequence) by the prompt's first
        # token: their first block fills as they decode, and its hash (their block_hashes[0], once registered) is
        # taken into the map when a prompt starting with that token is routed (only such a prompt can start with
        # that block), or by a sweep (_sweep_unhashed).
        self._unhashed: dict[int | None, list[tuple[int, Sequence]]] = {}
        self._num_unhashed = 0
        self._num_unhashed_kept = 0  # how many the last sweep kept

    def _fleet_of(self, engines: Seq[LLMEngine]) -> tuple:
        fleet = self._fleet
        if fleet is None or fleet[0] is not engines or len(fleet[1]) != len(engines):
            schedulers = [engine.scheduler for engine in engines]
            block_managers = [scheduler.block_manager for scheduler in schedulers]
            block_size = block_managers[0].block_size
            uniform = all(manager.block_size == block_size for manager in block_managers)
            fleet = self._fleet = (engines, schedulers, block_managers, prefix_caches(block_managers),
                                   block_size if uniform else None)
            self._first_block_replicas = None  # tracked admissions were another fleet's
            self._loads = None  # ... and tracked loads
        return fleet

    def track_admissions(self, engines: Seq[LLMEngine]) -> None:
        """For a caller that hands ``admitted`` every sequence it adds to ``engines`` from now on, their prefix caches
        empty now (a simulation's fleet): route then looks the prompt's first block up only in the caches of the
        replicas that were given a sequence starting with that block, instead of in every replica's: a fleet of 64
        spent half its routing on those lookups, one per replica per request, each a memory miss in a large cache
        (4 % of benchmarks/sim_million.py's time at 300,000 requests).

        The same choice: a block enters a replica's cache only from a sequence admitted there, and its hash is the
        first block's only if it is that sequence's first block (another block's hash chains its parent's: equal only
        by a 64-bit collision, which the caches do not guard against either)."""
        fleet = self._fleet_of(engines)
        self._first_block_replicas = {} if fleet[4] is not None else None  # (one block size: route's one pass)
        self._unhashed = {}
        self._num_unhashed = self._num_unhashed_kept = 0

    def admitted(self, index: int, seq: Sequence) -> None:
        """``seq`` was added to replica ``index`` (see ``track_admissions``)."""
        if self._first_block_replicas is None:
            return
        if seq.block_hashes:  # (the prompt's, as route hashed them)
            self._add_first_block(seq.block_hashes[0], index)
        elif not seq.is_finished:
            key = seq.token_ids[0] if seq.num_prompt_tokens else None  # (None: every first block's filled by decoding)
            self._unhashed.setdefault(key, []).append((index, seq))
            self._num_unhashed += 1
            if self._num_unhashed > 2 * self._num_unhashed_kept + 64:
                self._sweep_unhashed()

    def _add_first_block(self, block_hash: int, index: int) -> None:
        replicas = self._first_block_replicas.get(block_hash)
        if replicas is None:
            self._first_block_replicas[block_hash] = [index]
        elif index not in replicas:
            insort(replicas, index)

    def _take_unhashed(self, first_token: int) -> None:
        """Take the first blocks filled since by short prompts that start with ``first_token`` (a prompt that begins
        with such a block begins with that token) into the map."""
        for key in (first_token, None):
            pairs = self._unhashed.get(key)
            if pairs and any(seq.block_hashes for _, seq in pairs):
                for index, seq in pairs:
                    if seq.block_hashes:
                        self._add_first_block(seq.block_hashes[0], index)
                kept = [pair for pair in pairs if not pair[1].block_hashes]
                self._num_unhashed -= len(pairs) - len(kept)
                if kept:
                    self._unhashed[key] = kept
                else:
                    del self._unhashed[key]

    def _sweep_unhashed(self) -> None:
        """Take every short prompt's filled first block into the map, and drop those that finished without one."""
        unhashed: dict[int | None, list[tuple[int, Sequence]]] = {}
        for key, pairs in self._unhashed.items():
            for index, seq in pairs:
                if seq.block_hashes:
                    self._add_first_block(seq.block_hashes[0], index)
                elif not seq.is_finished:
                    unhashed.setdefault(key, []).append((index, seq))
        self._unhashed = unhashed
        self._num_unhashed = self._num_unhashed_kept = sum(map(len, unhashed.values()))

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
        first_block_replicas = self._first_block_replicas
        if not hashes:
            holders = []
        elif first_block_replicas is None:
            holders = holders_of_block(caches, hashes[0])
        else:
            if self._unhashed:
                self._take_unhashed(prompt_token_ids[0])
            first = hashes[0]
            holders = [index for index in first_block_replicas.get(first, ()) if first in caches[index]]
        if not holders:  # no replica has cached a block of it: the least loaded one
            loads = self._fleet_loads(schedulers)
            return loads.index(min(loads))
        if len(holders) == 1:
            # The one replica holding the first block holds the most cached blocks (at least one, the others none):
            # the cache's choice without counting them or reading its load (a session's later turn on 64 replicas,
            # mostly; counted, a call and a pass over the prompt's hashes for each).
            return self._balanced(holders[0], schedulers)
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
        loads = self._fleet_loads(schedulers)
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
