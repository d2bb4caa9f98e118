"""Probe D, session 33: the prefix router of a simulated fleet follows admissions (which replica was given each first
block) instead of looking the prompt's first block up in every replica's cache, and a request that cuts a replica's
lazy window moves the replica's wait onto the window's new end instead of interrupting it. Both change only the speed:
the same choices, the same outputs."""

from __future__ import annotations

import random

import pytest

from engine.core.block_manager import holders_of_block, prefix_block_hashes
from sim.config import SimConfig
from sim.router import PrefixAffinityRouter
from sim.simulator import simulate
from tests.engine.helpers import make_engine, params
from tests.sim.helpers import SHAREGPT, make_trace
from traces.schema import load_trace

BLOCK_SIZE = 4  # make_engine's default


class _UntrackedRouter(PrefixAffinityRouter):
    """The prefix router as it was: every replica's cache probed for the first block."""

    admitted = None  # (simulate tracks admissions only for a router that takes them)


class _CheckedRouter(PrefixAffinityRouter):
    """The tracked router, asserting at each route that the replicas it would probe hold what every cache holds."""

    checked = 0

    def route(self, prompt_token_ids, engines) -> int:
        fleet = self._fleet_of(engines)
        hashes = prefix_block_hashes(prompt_token_ids, fleet[4])
        if hashes and self._first_block_replicas is not None:
            self._take_unhashed(prompt_token_ids[0])
            first = hashes[0]
            tracked = [index for index in self._first_block_replicas.get(first, ()) if first in fleet[3][index]]
            assert tracked == holders_of_block(fleet[3], first)
            type(self).checked += 1
        return super().route(prompt_token_ids, engines)


def test_a_short_prompts_first_block_filled_by_decoding_is_found_where_it_was_decoded() -> None:
    """A prompt shorter than a block: its first block fills with generated tokens (make_engine's runner samples 7), and
    a later prompt that starts with that block goes to the replica that holds it, as probing every cache finds."""
    engines = [make_engine(block_size=BLOCK_SIZE)[0] for _ in range(3)]
    engines[0].add_request([900, 901, 902], params())  # busier: the short prompt goes to replica 1
    tracked = PrefixAffinityRouter()
    tracked.track_admissions(engines)
    index = tracked.route([5, 6], engines)
    assert index == 1
    tracked.admitted(index, engines[index].add_request([5, 6], params(max_tokens=4), block_hashes=[]))
    for _ in range(6):
        for engine in engines:
            engine.step()
    follow_up = [5, 6, 7, 7, 8, 9]
    assert engines[1].scheduler.block_manager.num_cached_prefix_blocks(prefix_block_hashes(follow_up, BLOCK_SIZE)) == 1
    assert tracked.route(follow_up, engines) == PrefixAffinityRouter().route(follow_up, engines) == 1


@pytest.mark.parametrize("seed", range(6))
def test_tracked_routing_chooses_as_probing_every_cache_does(seed: int) -> None:
    """Random prompts over a few shared prefixes, some shorter than a block, on small caches that evict: after every
    admission and step, the tracked router and a fresh one that probes every cache make the same choice."""
    rng = random.Random(seed)
    engines = [make_engine(block_size=BLOCK_SIZE, num_gpu_blocks=24)[0] for _ in range(4)]
    tracked = PrefixAffinityRouter()
    tracked.track_admissions(engines)
    prefixes = [[rng.randrange(10, 20) for _ in range(rng.choice((1, 3, 4, 6, 9)))] for _ in range(6)]
    for _ in range(120):
        prompt = rng.choice(prefixes) + [rng.randrange(10, 20) for _ in range(rng.randrange(0, 6))]
        if rng.random() < 0.2:
            prompt.extend([7] * rng.randrange(1, 5))  # what the runner decodes: a short prompt's filled first block
        expected = PrefixAffinityRouter().route(prompt, engines)
        index = tracked.route(prompt, engines)
        assert index == expected
        seq = engines[index].add_request(prompt, params(max_tokens=rng.randrange(1, 8)),
                                         block_hashes=tracked.last_block_hashes)
        tracked.admitted(index, seq)
        for engine in engines:
            for _ in range(rng.randrange(0, 3)):
                if engine.has_unfinished_requests():
                    engine.step()


CASES = {
    "sharegpt, 3 replicas": (lambda: load_trace(SHAREGPT).head(600).with_qps(30.0),
                             {"num_replicas": 3, "router": "prefix", "block_size": 16}),
    "sharegpt, 3 replicas, evicting": (lambda: load_trace(SHAREGPT).head(600).with_qps(30.0),
                                       {"num_replicas": 3, "router": "prefix", "block_size": 16,
                                        "num_gpu_blocks": 300}),
    "short prompts, 16 replicas": (lambda: _short_prompts_trace(60), {"num_replicas": 16, "router": "prefix",
                                                                      "block_size": 16}),
}


def _short_prompts_trace(num_groups: int):
    """Groups of six requests sharing their first 16-token hash block, half of them shorter than one block."""
    lengths, hash_ids = [], []
    for group in range(num_groups):
        first = 10 * group
        for length in (3, 20, 5, 40, 9, 17):
            lengths.append(length)
            hash_ids.append([first + k for k in range(-(-length // 16))])
    return make_trace(lengths, [30, 5, 40, 12, 3, 25] * num_groups, [0.01 * i for i in range(len(lengths))],
                      hash_ids=hash_ids, hash_block_size=16)


@pytest.mark.parametrize("case", sorted(CASES))
def test_tracked_admissions_give_the_outputs_of_probing_every_cache(case, monkeypatch) -> None:
    make, options = CASES[case]
    trace, config = make(), SimConfig(**options)
    import sim.simulator as simulator

    _CheckedRouter.checked = 0
    monkeypatch.setattr(simulator, "make_router", lambda name: _CheckedRouter())
    tracked = simulate(trace, config)
    assert _CheckedRouter.checked > 0
    monkeypatch.setattr(simulator, "make_router", lambda name: _UntrackedRouter())
    untracked = simulate(trace, config)
    assert tracked.requests_table().equals(untracked.requests_table())
    assert tracked.steps_table().equals(untracked.steps_table())
    assert sum(row[8] for row in tracked.request_rows) > 0  # prefix hits were compared too


def test_windows_cut_by_requests_give_the_step_by_step_outputs() -> None:
    """Requests routed to replicas in lazy windows cut them (the replica's wait moved onto the cut end): the outputs of
    the step loop, on a fleet where most requests arrive mid-window."""
    trace = load_trace(SHAREGPT).head(500).with_qps(12.0)
    config = SimConfig(num_replicas=4, router="prefix")
    forwarded = simulate(trace, config)
    stepped = simulate(trace, config, fast_forward=False)
    assert forwarded.num_fast_forward_steps > 0
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())


def _trace_with_arrivals_on_step_ends(config: SimConfig, num_on_ends: int, seed: int):
    """Requests of five shared prefixes, then ``num_on_ends`` more, each arriving exactly as a step of some replica
    ends in the step loop (picked from a run with the requests before it: a later arrival changes nothing before it,
    so that step still ends there)."""
    rng = random.Random(seed)
    rows = []  # (arrival_s, prompt tokens, output tokens, hash ids)

    def add(arrival_s: float) -> None:
        prompt = rng.randrange(5, 300)
        rows.append((arrival_s, prompt, rng.randrange(2, 300), [1000 * rng.randrange(5) + k
                                                                for k in range(-(-prompt // 16))]))

    def trace():
        rows.sort(key=lambda row: row[0])
        return make_trace(*([row[i] for row in rows] for i in (1, 2, 0)), hash_ids=[row[3] for row in rows],
                          hash_block_size=16)

    for arrival_s in [0.0, *sorted(rng.uniform(0.0, 2.0) for _ in range(19))]:
        add(arrival_s)
    for _ in range(num_on_ends):
        steps = simulate(trace(), config, fast_forward=False).steps_table()
        after_s = rng.uniform(0.0, rows[-1][0] + 0.5)
        ends_s = sorted({start + duration for start, duration in zip(steps["start_s"].to_pylist(),
                                                                     steps["duration_s"].to_pylist())
                         if start + duration > after_s})
        if ends_s:
            add(ends_s[rng.randrange(min(5, len(ends_s)))])
    return trace()


@pytest.mark.parametrize("router", ["prefix", "lor"])
def test_arrivals_exactly_as_steps_end_in_lazy_windows_give_the_step_by_step_outputs(router, monkeypatch) -> None:
    """A lazy window is planned through arrivals that come exactly as one of its steps ends (the arrival first, as in
    the step loop: Arrival's urgent priority; advance applies no finish of that step, cut keeps it): the outputs are
    the step loop's, on small caches too."""
    from engine.core.quiet_window import QuietRun

    planned_ends = []
    init = QuietRun.__init__

    def init_and_note(run, engine, token_id, window, starts, ends):
        planned_ends.append(set(ends.tolist()))
        init(run, engine, token_id, window, starts, ends)

    monkeypatch.setattr(QuietRun, "__init__", init_and_note)
    for num_gpu_blocks in (None, 200):
        config = SimConfig(num_replicas=3, router=router, block_size=16, num_gpu_blocks=num_gpu_blocks)
        trace = _trace_with_arrivals_on_step_ends(config, 20, seed=7)
        planned_ends.clear()
        forwarded = simulate(trace, config)
        stepped = simulate(trace, config, fast_forward=False)
        assert forwarded.requests_table().equals(stepped.requests_table())
        assert forwarded.steps_table().equals(stepped.steps_table())
        arrivals_s = set(trace.requests["arrival_s"].to_list())
        assert sum(len(ends & arrivals_s) for ends in planned_ends) >= 5  # windows planned through such arrivals
