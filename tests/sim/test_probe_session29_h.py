"""Probe H (session 29): an independent attempt to break quiet windows that requests wait through (probe G, commit
ead5e25: engine.core.quiet_window.admits_none). The contract: simulate's outputs are the same with fast_forward on
and off, for every configuration.

Finding 1, simulate(max_steps=...), the step-log guard sim.replay sets from the host's memory. Input: mns 1,
quarter-second steps, 212 one-token requests one a second, then one of 2,000 tokens and 87 more arriving while it
decodes (2,299 steps in all). Before: max_steps=1000 raised StepLimitError fast-forwarded and ran to its end step by
step (2,299 steps, past the limit: every threshold from 421 to 2,211 parted the two). The count at a check (every 256
arrivals and finishes) took every planned step of a window in progress, which one requests wait through holds across
their arrivals (the whole 2,000-token decode: a count of 2,212 against 421 steps run); and the
step loop's last check came 88 events before its end, so its last 1,878 steps went unchecked. After: a check counts
a window's steps that have ended (as the step loop's logs hold them), and the run's end checks the logs once more:
both raise for every limit below 2,299 and both run at 2,299 (sim/simulator.py, check_steps).

Otherwise none. A seeded fuzzer (the one below, over 20,000 cases, 6,000 more with capacity's CertainMiss watch
and traces of up to 120 requests, and 1,200 as sim.bands replays with the shipped profile) found no difference
between the two tables, nor between a run's step-log ``num_waiting`` and a recount from its requests (arrived by
the step's end, not scheduled by its start: 11,303 runs without preemption or a stop). Of the first 20,000 cases
7,717 formed windows while requests waited (77,507 such windows, 3.78 million of their steps). Cases drawn: 2-30
requests, arrivals on the 0.25-s step ends of tests.sim.helpers.QuarterSecondSteps (ties with step ends and with
each other) or exponential gaps under the shipped profile; mixed and nano policies, max_num_seqs 1-6,
max_num_batched_tokens from 1 (below max_num_seqs: budget-held windows) to 8192, blocks of 16/32/256 tokens, caches
small enough to preempt, prefix caching on and off, max_model_len cuts, multi-turn prompts (hash_ids), 1-4 replicas
behind rr, lor and prefix routers, constant and episodic host slowdowns, and a StopAt watch stopping a third of the
runs (on step ends, inside steps, before the first step). sim.replay's files (sharegpt's first 200 requests, mns 2, 2
replicas, lor) were byte-identical with fast-forward off. A capacity sweep (sharegpt's first 200 requests,
max_num_seqs 1,2,4 x mixed,nano x rr,lor x 1,2 replicas, TTFT and queue SLOs, early stop on; 144 simulations) gave
a byte-identical capacity.json (and the same capacity.parquet) as the tree with ead5e25 reverted.

This file keeps a compact version of that fuzzer (a few hundred cases), which also checks that windows with requests
waiting did form in many of them (planned with ``admits_none``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import sim.simulator as simulator
from sim.config import SimConfig
from sim.simulator import StepLimitError, simulate
from tests.sim.helpers import QuarterSecondSteps, StopAt, make_trace, record_waiting_windows

NUM_CASES = 240


def _case(rng: random.Random):
    """(trace, config, cost model or None for the shipped profile, StopAt time or None)."""
    n = rng.randrange(2, 30)
    quarter = rng.random() < 0.6  # quarter-second steps: arrivals tie with step ends
    arrivals, t = [], 0.0
    for _ in range(n):
        r = rng.random()
        if quarter:
            if r < 0.5:  # on a step end
                t = 0.25 * rng.randrange(int(t / 0.25), int(t / 0.25) + 12)
            elif r >= 0.7:
                t += rng.uniform(0, 2)
        elif r >= 0.2:  # (else a tie with the request before)
            t += rng.expovariate(rng.choice([50, 200, 1000]))
        arrivals.append(t)
    arrivals.sort()
    hash_ids = hash_block_size = None
    if rng.random() < 0.3:  # multi-turn conversations: each prompt the one before it plus a few blocks
        hash_block_size, hash_ids, prompts, next_id = 16, [], [], 1000
        conversations = [[] for _ in range(rng.randrange(1, 4))]
        for _ in range(n):
            c = rng.randrange(len(conversations))
            added = rng.randrange(1, 4)
            conversations[c] = conversations[c] + list(range(next_id, next_id + added))
            next_id += added
            hash_ids.append(list(conversations[c]))
            prompts.append(len(conversations[c]) * hash_block_size - rng.randrange(0, hash_block_size))
    else:
        prompts = [rng.choice([rng.randrange(1, 20), rng.randrange(1, 100), rng.randrange(1, 600)]) for _ in range(n)]
    outputs = [rng.choice([rng.randrange(1, 10), rng.randrange(1, 80), rng.randrange(1, 300)]) for _ in range(n)]
    block_size = rng.choice([16, 32, 256])
    options = {
        "policy": rng.choice(["mixed", "nano"]),
        "max_num_seqs": rng.randrange(1, 7),
        "max_num_batched_tokens": rng.choice([rng.randrange(1, 8), rng.randrange(1, 80), 512, 8192]),
        "block_size": block_size,
        "enable_prefix_caching": rng.random() < 0.6,
        "num_replicas": rng.choice([1, 1, 2, 3, 4]),
        "router": rng.choice(["rr", "lor", "prefix"]),
    }
    if rng.random() < 0.4:  # a small cache: preemption
        need = max((p + o) // block_size + 2 for p, o in zip(prompts, outputs))
        options["num_gpu_blocks"] = rng.randrange(max(2, need // 2), need * 3 + 3)
    if rng.random() < 0.3:
        options["max_model_len"] = rng.randrange(16, 700)
    speeds = ["1", "episodes:1,1.6,0.25,4"] if quarter else ["1", "1", "1.7", "episodes:1,1.6,0.25,4",
                                                               "episodes:1,3,0.5,0.6"]
    options["host_slowdown"] = rng.choice(speeds)
    stop_s = None
    if rng.random() < 0.35:
        stop_s = rng.choice([0.25 * rng.randrange(1, 80), rng.uniform(0, 20), rng.uniform(0, 0.3)])
    trace = make_trace(prompts, outputs, arrivals, hash_ids, hash_block_size)
    return trace, SimConfig(**options), QuarterSecondSteps() if quarter else None, stop_s


def _simulate(trace, config, cost_model, stop_s, fast_forward: bool):
    kwargs = {} if cost_model is None else {"cost_model": cost_model}
    if stop_s is not None:
        kwargs["watch"] = StopAt(stop_s)
    return simulate(trace, config, fast_forward=fast_forward, **kwargs)


def _check_num_waiting(result) -> bool:
    """Each step row's num_waiting against a recount from the requests: those routed to its replica that arrived by
    the step's end and were not scheduled by its start (well-defined without preemption, rejection or a stop).
    False where not checked."""
    steps = result.steps_table().to_pydict()
    requests = result.requests_table().to_pydict()
    if not steps["step"] or any(steps["num_preempted"]) or result.stopped_s is not None:
        return False
    served = [i for i, reason in enumerate(requests["finish_reason"]) if reason != "rejected"]
    replicas = np.array([requests["replica"][i] for i in served])
    arrivals = np.array([requests["arrival_s"][i] for i in served])
    scheduled = np.array([requests["first_scheduled_s"][i] for i in served], dtype=np.float64)
    for replica, start, duration, waiting in zip(steps["replica"], steps["start_s"], steps["duration_s"],
                                                 steps["num_waiting"]):
        mine = replicas == replica
        expected = int((mine & (arrivals <= start + duration) & (scheduled > start)).sum())
        assert waiting == expected, f"replica {replica}, step from {start}: num_waiting {waiting}, recount {expected}"
    return True


def test_seeded_fuzz_fast_forward_with_requests_waiting(monkeypatch):
    waited = record_waiting_windows(monkeypatch)
    rng = random.Random(29_8)
    cases_with_windows = recounted = stopped_in_window = 0
    for case in range(NUM_CASES):
        trace, config, cost_model, stop_s = _case(rng)
        before = len(waited)
        forwarded = _simulate(trace, config, cost_model, stop_s, True)
        stepped = _simulate(trace, config, cost_model, stop_s, False)
        what = f"case {case}: {config}, stop at {stop_s}"
        assert forwarded.stopped_s == stepped.stopped_s, what
        assert forwarded.requests_table().equals(stepped.requests_table()), what
        assert forwarded.steps_table().equals(stepped.steps_table()), what
        cases_with_windows += len(waited) > before
        stopped_in_window += len(waited) > before and stop_s is not None and forwarded.stopped_s is not None
        recounted += _check_num_waiting(stepped)
    # The draws reach what they are for: windows with requests waiting in many cases, some stopped by a watch.
    assert cases_with_windows > NUM_CASES // 4 and sum(waited) > 10_000
    assert stopped_in_window > 5 and recounted > NUM_CASES // 3


@pytest.mark.parametrize("max_num_seqs", [31, 32, 33])
def test_waiting_windows_at_the_size_limit(max_num_seqs, monkeypatch):
    """Batches of about _MAX_QUEUED_WINDOW_SEQS (32) rows at max_num_seqs, a queue behind them: the largest planned
    with requests waiting, the scheduler's large-batch path (lazy tokens) taken (from _MIN_LAZY_STEADY_ROWS, 16)."""
    rng = random.Random(max_num_seqs)
    n = 160
    trace = make_trace([rng.randrange(4, 60) for _ in range(n)], [rng.randrange(20, 200) for _ in range(n)],
                       sorted(rng.uniform(0, 0.3) for _ in range(n)))
    config = SimConfig(max_num_seqs=max_num_seqs, block_size=16, host_slowdown="1")
    with monkeypatch.context() as patch:
        waited = record_waiting_windows(patch)
        forwarded = simulate(trace, config)
    stepped = simulate(trace, config, fast_forward=False)
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())
    assert _check_num_waiting(stepped)
    assert (len(waited) > 10) == (max_num_seqs <= simulator._MAX_QUEUED_WINDOW_SEQS)  # (31, 32: some 40 windows)


def _outcome(trace, config, fast_forward: bool, max_steps: int):
    try:
        return simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=fast_forward,
                        max_steps=max_steps)
    except StepLimitError:
        return None


def test_step_limit_counts_the_steps_run_not_a_waiting_windows_plan():
    """Finding 1: a window requests wait through spans their arrivals; a step-limit check during it counted its
    planned steps, and the step loop's last check came long before its end."""
    quick = 212
    trace = make_trace([8] * (quick + 88), [1] * quick + [2000] + [1] * 87,
                       [float(i) for i in range(quick + 1)] + [quick + 10.0 + 0.5 * i for i in range(87)])
    config = SimConfig(max_num_seqs=1, block_size=16, host_slowdown="1")
    full = simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=False)
    num_steps = full.steps_table().num_rows
    assert num_steps == 2299
    for max_steps in (421, 1000, 2211, 2298):  # below its own steps: both stop (before: fast-forwarded only)
        outcomes = [_outcome(trace, config, fast_forward, max_steps) for fast_forward in (True, False)]
        assert outcomes == [None, None], max_steps
    forwarded, stepped = (_outcome(trace, config, fast_forward, num_steps) for fast_forward in (True, False))
    assert forwarded.steps_table().equals(stepped.steps_table())
    assert forwarded.requests_table().equals(full.requests_table())
