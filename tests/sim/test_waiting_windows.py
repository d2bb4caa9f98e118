"""Quiet windows while requests wait: where none of them can be admitted before the window's first finish (the running
batch at max_num_seqs, or under the mixed policy its decode rows taking the whole token budget), the decode steps up
to that finish are fast-forwarded, arrivals meanwhile only joining the queue (each row counting the requests waiting
after its step). Outputs are byte-identical with fast-forward on and off, and such windows do occur: the same runs
with them refused (engine.core.quiet_window.admits_none False, the planner's rule before them) fast-forward fewer
steps."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.core.quiet_window as quiet_window
import sim.simulator as simulator
from engine.core.quiet_window import QuietRun
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT, QuarterSecondSteps, StopAt, make_trace, record_waiting_windows
from traces.schema import load_trace


def _identical(a, b) -> None:
    assert a.requests_table().equals(b.requests_table())
    assert a.steps_table().equals(b.steps_table())


def _run(trace, config: SimConfig, monkeypatch, **kwargs):
    """(fast-forwarded, step by step, windows planned while requests waited, fast-forwarded steps without them)."""
    with monkeypatch.context() as patch:
        waited = record_waiting_windows(patch)
        forwarded = simulate(trace, config, **kwargs)
    stepped = simulate(trace, config, fast_forward=False, **kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(quiet_window, "admits_none", lambda scheduler: False)
        without = simulate(trace, config, **kwargs)
    _identical(without, stepped)
    return forwarded, stepped, waited, without.num_fast_forward_steps


CASES = {
    "1 seq, mixed": {"max_num_seqs": 1},
    "1 seq, nano": {"max_num_seqs": 1, "policy": "nano"},
    "2 seqs, mixed": {"max_num_seqs": 2},
    "2 seqs, nano, no caching": {"max_num_seqs": 2, "policy": "nano", "enable_prefix_caching": False},
    "4 seqs, mixed, 16-token blocks": {"max_num_seqs": 4, "block_size": 16},
    "4 seqs, nano": {"max_num_seqs": 4, "policy": "nano"},
    "3 replicas, rr": {"max_num_seqs": 2, "num_replicas": 3, "router": "rr"},
    "3 replicas, lor": {"max_num_seqs": 2, "num_replicas": 3, "router": "lor"},
    "3 replicas, prefix": {"max_num_seqs": 4, "num_replicas": 3, "router": "prefix", "block_size": 16},
    "2 replicas, lor, nano": {"max_num_seqs": 1, "num_replicas": 2, "router": "lor", "policy": "nano"},
    # Short prompts, long outputs: batches at max_num_seqs outgrow the cache, and preempt.
    "tiny cache, mixed": {"max_num_seqs": 4, "num_gpu_blocks": 40, "block_size": 16},
    "tiny cache, nano": {"max_num_seqs": 4, "num_gpu_blocks": 40, "block_size": 16, "policy": "nano"},
    "tiny cache, lor": {"max_num_seqs": 3, "num_gpu_blocks": 30, "block_size": 16, "num_replicas": 2, "router": "lor"},
    "host speed episodes": {"max_num_seqs": 2, "host_slowdown": "episodes:1,1.6,0.25,4"},
}


def _short_prompts(n: int, qps: float):
    rng = random.Random(n)
    arrivals = [0.0]
    for _ in range(n - 1):
        arrivals.append(arrivals[-1] + rng.expovariate(qps))
    return make_trace([rng.randrange(4, 40) for _ in range(n)], [rng.randrange(40, 220) for _ in range(n)], arrivals)


@pytest.mark.parametrize("case", sorted(CASES))
def test_windows_with_requests_waiting_give_the_step_loops_outputs(case, monkeypatch):
    config = SimConfig(**CASES[case])
    if config.num_gpu_blocks is not None:
        trace = _short_prompts(150, 20.0 * config.num_replicas)
    else:
        trace = load_trace(SHAREGPT).head(100).with_qps(4.0 * config.num_replicas)  # a queue on every replica
    forwarded, stepped, waited, without = _run(trace, config, monkeypatch)
    _identical(forwarded, stepped)
    assert waited and sum(waited) > 100
    assert forwarded.num_fast_forward_steps > without + 100
    if "num_gpu_blocks" in CASES[case]:  # preemption-heavy: requests were preempted, and still windows formed
        assert stepped.steps_table().column("num_preempted").to_numpy().sum() > 0
    # Rows inside windows count arrivals as they come: the waiting count changes between two decode steps of a batch.
    steps = stepped.steps_table()
    waiting, continues = (steps.column(c).to_numpy() for c in ("num_waiting", "continues_batch"))
    assert ((waiting[1:] != waiting[:-1]) & (continues[1:] == 1)).any()


@pytest.mark.parametrize("policy", ["mixed", "nano"])
@pytest.mark.parametrize("deployment", [{}, {"num_replicas": 2, "router": "lor"},
                                        {"num_replicas": 2, "router": "prefix"}], ids=["one", "lor", "prefix"])
def test_overloaded_full_batches_of_256(policy, deployment, monkeypatch):
    """Past saturation at max_num_seqs 256: batches stay full, a queue behind them. The simulator plans no such window
    for batches that large by default (their first finish is a few steps off: not worth a plan); allowed here, they
    form and change nothing."""
    monkeypatch.setattr(simulator, "_MAX_QUEUED_WINDOW_SEQS", 1 << 20)
    trace = load_trace(SHAREGPT).head(900).with_qps(300.0)
    config = SimConfig(policy=policy, **deployment)
    forwarded, stepped, waited, without = _run(trace, config, monkeypatch)
    _identical(forwarded, stepped)
    steps = stepped.steps_table()
    assert (steps.column("num_running").to_numpy() == 256).sum() > 150
    assert waited and forwarded.num_fast_forward_steps > without


@pytest.mark.parametrize("runs_ahead", [False, True])
def test_the_mixed_policy_admits_none_when_the_decodes_take_the_token_budget(monkeypatch, runs_ahead):
    """max_num_batched_tokens 4 below max_num_seqs 8: four decode rows leave no budget to admit with (mixed). With the
    shipped profile (an engine that runs ahead) the window's steps are not ran_ahead: the GPU runner launches ahead
    only where no request can be admitted next as the scheduler flags it (next_admits_none: nobody waits, or the
    batch is at max_num_seqs), which a budget-held batch is not; the window marked them all."""
    gap_s = 0.005 if runs_ahead else 0.05  # the profile's steps take milliseconds: a queue needs closer arrivals
    trace = make_trace([3] * 30, [60] * 30, [gap_s * i for i in range(30)])
    config = SimConfig(max_num_seqs=8, max_num_batched_tokens=4, max_model_len=64, block_size=16, host_slowdown="1")
    kwargs = {} if runs_ahead else {"cost_model": QuarterSecondSteps()}
    forwarded, stepped, waited, without = _run(trace, config, monkeypatch, **kwargs)
    _identical(forwarded, stepped)
    assert waited and forwarded.num_fast_forward_steps > without + 100
    if runs_ahead:  # steps that repeat their batch, nobody waiting, are ran_ahead; the budget-held ones are not
        steps = stepped.steps_table()
        ran = steps.column("ran_ahead").to_numpy()
        waiting = steps.column("num_waiting").to_numpy()
        assert ran.any() and not ran[waiting > 0].all()


def _tie_trace(seed: int):
    """Arrivals on quarter-second step ends (and between them), outputs long enough for windows."""
    rng = random.Random(seed)
    n = 40
    arrivals = sorted(rng.choice([0.25 * rng.randrange(0, 160), rng.uniform(0, 40)]) for _ in range(n))
    return make_trace([rng.randrange(1, 70) for _ in range(n)], [rng.randrange(1, 90) for _ in range(n)], arrivals)


@pytest.mark.parametrize("router", ["rr", "lor", "prefix"])
@pytest.mark.parametrize("policy", ["mixed", "nano"])
def test_arrivals_and_stops_on_step_ends(router, policy, monkeypatch):
    """Quarter-second steps: arrivals exactly on step ends, and watches stopping runs on a step's end and inside a
    step, in the middle of windows that requests wait through."""
    config = SimConfig(block_size=16, host_slowdown="1", num_replicas=2, router=router, max_num_seqs=2, policy=policy)
    for seed in range(2):
        trace = _tie_trace(seed)
        forwarded, stepped, waited, without = _run(trace, config, monkeypatch, cost_model=QuarterSecondSteps())
        _identical(forwarded, stepped)
        assert waited and forwarded.num_fast_forward_steps > without
        for stop_s in (5.0, 12.25, 17.6, 30.1):
            watched = [simulate(trace, config, cost_model=QuarterSecondSteps(), watch=StopAt(stop_s),
                                fast_forward=fast_forward) for fast_forward in (True, False)]
            assert watched[0].stopped_s == stop_s
            _identical(*watched)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(0, 5), st.lists(st.tuples(st.integers(0, 45), st.integers(0, 2)), max_size=8),
       st.booleans())
def test_waiting_counts_as_stretches_match_the_count_after_each_step(steps, num_waiting, joins, on_ends):
    """QuietRun._waiting_changes (stretches of one count, what finish writes runs from) gives every step the count
    the step loop gives it: those waiting at the start plus those that joined by the step's end (a join at a step's
    very end counted in it); joins only grow the queue, or leave it (a rejected arrival)."""
    ends = np.cumsum(np.full(steps, 0.5))
    times, counts, count = [], [], num_waiting
    for at, grows in sorted(joins):
        times.append(float(ends[min(at, steps - 1)]) if on_ends else at * 0.5 - 0.25)
        count += grows
        counts.append(count)
    order = np.argsort(times, kind="stable")
    run = SimpleNamespace(ends=ends, _num_waiting=num_waiting, _waited_s=[times[i] for i in order],
                          _waited=[counts[i] for i in order])
    changes = QuietRun._waiting_changes(run, steps)
    per_step = []
    for (first, value), nxt in zip(changes, [c[0] for c in changes[1:]] + [steps]):
        per_step.extend([value] * (nxt - first))
    all_counts = [num_waiting, *run._waited]
    joined = np.searchsorted(np.asarray(run._waited_s, dtype=np.float64), ends, side="right")
    assert per_step == [all_counts[n] for n in joined.tolist()]
    assert changes[0][0] == 0 and all(a[1] != b[1] and a[0] < b[0] for a, b in zip(changes, changes[1:]))
