"""Session 31, probe D: differential fuzzing of the simulator's speed-ups (fast_forward and lazy_tokens on against
off, and the scheduler's large-batch path against the per-row one), with invariants on every run.

Finding (fixed):

- A large batch (32 running sequences or more: the scheduler's steady path, engine.core.steady_decodes) holding a
  prompt chunked so that its last token is left to compute alone. Input: 32 one-token prompts and one of 5 tokens at
  t=0, 20 and 10 output tokens, max_num_batched_tokens 34 (the 5-token prompt computes 2 + 2 + 1), quarter-second
  steps. Before: after its second chunk the sequence was filed as a plain decode (one token to compute), and the next
  step's plain rows got their token without postprocess's first-token bookkeeping: the step loop recorded its
  first_token_s at 3.0 s (a later token's time, set when a row of it was next handled) while its first token time was
  0.75 s; fast-forwarded, a quiet window set it to 0.75 s, so requests.parquet differed with fast_forward on and off
  (and the step loop's TTFT was wrong; the GPU engine shares this scheduler path). The fuzz met it in 4 of about
  3,000 cases before the fix (max_num_seqs 33-40, token budgets 40-64). After: a sequence without its first token is
  not filed (SteadyDecodes.file); its next row takes the per-row path, which records it.

Otherwise none: after the fix, about 2,300 seeded cases (1,800 run four ways, fast_forward x lazy_tokens; 400 five
ways, with the per-row scheduler path as a fifth) found no difference and no broken invariant (every request finished
or rejected with a reason, token counts equal to the output asked for unless cut, first and last token times equal to
first_token_s and finish_s, step logs in order per replica, no negative counts, batches within their limits). Drawn:
1-160 requests; tiny prompts, prompts at max_model_len -1..+1, multi-turn hash-id sessions (16/32/256-token hash
blocks), outputs of 1-2 tokens to 400; bursts at one instant, arrivals on multiples of the step time, Poisson,
offline; mixed and nano; blocks of 16/32/256; small caches (preemptions); max_num_seqs 1-8, 32-64 (the large-batch
path, lazy tokens) and 256; token budgets from 1 to 8192; 1-4 replicas behind rr, lor and prefix; greedy,
temperature, top-k and top-p sampling (distinct first tokens); constant and episodic host slowdowns (5-part specs
with their own seed, 1-ms episodes); the shipped profile, the roofline (qwen3-0.6b and 8b), sim.bands replays and
batch-dependent dyadic step times; a StopAt watch on a quarter of them. The fuzz below keeps the large-batch part
(it fails before the fix).
"""

from __future__ import annotations

import random

import pytest

from engine.core.scheduler import Scheduler
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import QuarterSecondSteps, StopAt, make_trace


def test_a_prompt_with_one_token_left_is_not_filed_as_a_plain_decode():
    """SteadyDecodes.file: one token left to compute is a decode only once the first token came."""
    from engine.core.sampling_params import SamplingParams
    from engine.core.sequence import Sequence, SequenceStatus
    from engine.core.steady_decodes import SteadyDecodes

    seq = Sequence(1, list(range(8, 28)), SamplingParams(max_tokens=100))  # 20 prompt tokens
    seq.num_computed_tokens = 19  # its last prompt token to compute: the row samples the first token
    seq.block_table = [0, 1]
    seq.status = SequenceStatus.RUNNING
    steady = SteadyDecodes(16, False)
    steady.file(seq)
    assert seq not in steady.steady and seq in steady.unsteady
    seq.num_computed_tokens, seq.first_token_s = 20, 1.0  # its first token came: a decode from now on
    seq.token_ids.append(9)
    steady.file(seq)
    assert seq in steady.steady and seq not in steady.unsteady


def _last_token_alone_trace(num_short: int = 32):
    """``num_short`` one-token prompts and one 5-token prompt, all at t=0: with a token budget of num_short + 2 the
    long prompt computes 2, 2, then its last token alone, in a batch large enough for the steady path."""
    return make_trace([1] * num_short + [5], [20] * num_short + [10], [0.0] * (num_short + 1))


@pytest.mark.parametrize("fast_forward", [True, False])
@pytest.mark.parametrize("steady", [True, False], ids=["steady-path", "per-row"])
def test_a_prompts_last_token_computed_alone_in_a_large_batch_records_its_first_token(fast_forward, steady,
                                                                                      monkeypatch):
    monkeypatch.setattr(Scheduler, "steady_plain_decodes", steady)
    config = SimConfig(max_num_seqs=64, max_num_batched_tokens=34, block_size=16)
    result = simulate(_last_token_alone_trace(), config, cost_model=QuarterSecondSteps(), fast_forward=fast_forward)
    table = result.requests_table().to_pydict()
    row = table["request_id"].index("32")
    # Prefilled in steps ending 0.25 and 0.5, its last prompt token alone in the step ending 0.75: its first token.
    assert table["token_times_s"][row][:2] == [0.75, 1.0]
    assert table["first_token_s"][row] == 0.75
    for first, times in zip(table["first_token_s"], table["token_times_s"]):
        assert first == times[0]


@pytest.mark.parametrize("lazy_tokens", [True, False])
def test_the_last_token_alone_gives_the_same_rows_fast_forwarded(lazy_tokens):
    trace = _last_token_alone_trace()
    config = SimConfig(max_num_seqs=64, max_num_batched_tokens=34, block_size=16)
    forwarded = simulate(trace, config, cost_model=QuarterSecondSteps(), lazy_tokens=lazy_tokens)
    stepped = simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=False, lazy_tokens=False)
    assert forwarded.num_fast_forward_steps > 0
    assert forwarded.requests_table().equals(stepped.requests_table())
    assert forwarded.steps_table().equals(stepped.steps_table())


def _case(rng: random.Random):
    """A large batch (the steady path, lazy tokens) under chunked prefill with small token budgets, or a small one:
    (trace, config, StopAt time or None)."""
    big = rng.random() < 0.6
    n = rng.randrange(40, 110) if big else rng.randrange(2, 30)
    step = 0.25
    arrivals, t = [], 0.0
    spread = 0.1 if big else 1.0  # a large batch needs most requests in bursts
    for _ in range(n):
        r = rng.random() / spread
        if r < 0.3:
            t = step * rng.randrange(int(t / step) + 1, int(t / step) + 6)  # on a step end
        elif r < 0.5:
            t += rng.expovariate(20)
        arrivals.append(t)  # else a burst: the same instant as the one before
    hash_ids = hash_block_size = None
    if big:  # mostly one-token prompts, admitted a budget's worth a step, and some a few chunks long
        prompts = [rng.choice([1, 1, 1, rng.randrange(2, 24)]) for _ in range(n)]
    elif rng.random() < 0.3:  # multi-turn conversations: each prompt the one before it plus a few blocks
        hash_block_size, hash_ids, prompts, next_id = 16, [], [], 1000
        conversations = [[] for _ in range(rng.randrange(1, 5))]
        for _ in range(n):
            c = rng.randrange(len(conversations))
            conversations[c] = conversations[c] + list(range(next_id, next_id + rng.randrange(1, 3)))
            next_id += 3
            hash_ids.append(list(conversations[c]))
            prompts.append(len(conversations[c]) * hash_block_size - rng.randrange(0, hash_block_size))
    else:
        prompts = [rng.choice([rng.randrange(1, 9), rng.randrange(1, 60)]) for _ in range(n)]
    outputs = [rng.choice([1, 2, rng.randrange(1, 40), rng.randrange(20, 120)] + [rng.randrange(60, 200)] * 3 * big)
               for _ in range(n)]
    block_size = rng.choice([16, 32, 256])
    options = {
        "policy": "mixed" if big or rng.random() < 0.5 else "nano",
        "max_num_seqs": rng.choice([32, 33, 40, 48]) if big else rng.randrange(1, 9),
        "max_num_batched_tokens": rng.choice([3, 16, 512]),
        "block_size": block_size,
        "enable_prefix_caching": rng.random() < 0.7,
        "num_replicas": rng.choice([1, 1, 2]) if big else rng.choice([1, 1, 2, 3]),
        "router": rng.choice(["rr", "lor", "prefix"]),
        "host_slowdown": rng.choice(["1", "episodes:1,1.6,0.25,4"]),
    }
    if big:  # a few tokens a step beside the batch's decodes: prompts chunked, some ending in one token alone
        options["max_num_batched_tokens"] = rng.choice([32, options["max_num_seqs"]]) + rng.randrange(1, 12)
    if options["policy"] == "nano":
        options["max_num_batched_tokens"] = 512
    if rng.random() < 0.3:  # a small cache: preemptions
        need = max((p + o) // block_size + 2 for p, o in zip(prompts, outputs))
        options["num_gpu_blocks"] = rng.randrange(need, need * (12 if big else 3) + 3)
    if rng.random() < 0.3:
        options["temperature"] = 0.7  # distinct first tokens: a step with a prefill row is never lazy
    stop_s = step * rng.randrange(1, 120) if rng.random() < 0.2 else None
    return make_trace(prompts, outputs, arrivals, hash_ids, hash_block_size), SimConfig(**options), stop_s


def test_seeded_fuzz_speedups_with_large_batches_and_small_budgets(monkeypatch):
    """fast_forward and lazy_tokens on against both off, byte for byte, with every request's first token time its
    first token's (the rows owed tokens lazily and the rows a window applied included)."""
    from engine.core.steady_decodes import SteadyDecodes

    lazy_steps = []
    log_step = SteadyDecodes.log_step
    monkeypatch.setattr(SteadyDecodes, "log_step", lambda self, *args: (lazy_steps.append(1), log_step(self, *args)))
    rng = random.Random(31_4)
    for case in range(120):
        trace, config, stop_s = _case(rng)
        runs = []
        for fast in (True, False):
            watch = None if stop_s is None else StopAt(stop_s)
            runs.append(simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=fast, lazy_tokens=fast,
                                 watch=watch))
        forwarded, stepped = runs
        what = f"case {case}: {config}, stop at {stop_s}"
        assert forwarded.stopped_s == stepped.stopped_s, what
        assert forwarded.requests_table().equals(stepped.requests_table()), what
        assert forwarded.steps_table().equals(stepped.steps_table()), what
        table = stepped.requests_table().to_pydict()
        for first, times, reason in zip(table["first_token_s"], table["token_times_s"], table["finish_reason"]):
            if times:
                assert first == times[0], what
            else:
                assert first is None and reason in (None, "rejected"), what
    assert len(lazy_steps) > 100  # the large-batch path's lazy steps were met
