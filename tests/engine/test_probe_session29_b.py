"""Probe (twenty-ninth session, B): the offline fidelity rule widened. engine.replay on the CPU (tiny random Qwen3)
against the simulator (same options, the engine's KV block count) over the configurations a serving engineer uses.

Found:

- Every schedule matched, step by step (batches, prefill tokens, preemptions, finishes, queues, KV blocks,
  continues_batch) and request by request (cached tokens, preemptions, finish reasons), over: both policies; block
  sizes 16, 32 and 256; max_num_seqs 1, 2 and 3; caches small enough to preempt; token budgets below the prompts
  and equal to them (chunks ending exactly at a prompt's end); prefix caching on and off with multi-turn shared
  prefixes and identical prompts; prompts a multiple of the block size; max_tokens 1; requests cut by
  max_model_len, by the KV cache (kv_capacity) and by the nano token budget (token_budget), each side naming the
  same cut; a prompt exactly max_model_len long (its one token is no cut); batches of 40-64 running sequences (the
  scheduler's large-batch path, the simulator's lazy tokens and quiet windows). EOS: both replays ask for the
  trace's output lengths with ignore_eos (traces.requests), so a random model's eos never ends a request on either
  side; the simulator's token (-1) is no eos of any model.
- ran_ahead differed. The engine launches a step ahead only where no request can be admitted next
  (ScheduledBatch.next_admits_none: none waits, or the batch is at max_num_seqs), and holds the launch back for a
  request arriving meanwhile. The simulator, with a profile of such an engine, marked every step that repeats its
  batch: under KV pressure, with requests waiting that do not fit, 113 steps against the engine's 21 (block 16,
  max_num_seqs 3: kv-pressure-16 below). Over 36 engine replays ran_ahead was exactly continues_batch and the
  step's own next_admits_none (a repeating step admitted nobody, so whoever kept the step before from launching
  it still waits at its schedule), which the simulator's runner now marks (sim/runner.py; a quiet window holds no
  waiting request and marks as before). Pricing unchanged: a repeating step is priced as the profile's grid
  measured it (launched ahead) either way (README); the GPU runner's own limits (scratch blocks for rows opening
  a block in lockstep, decode batches past the largest graph) are not modelled.
- Identical prompts sampled (engine.replay --temperature 0.7) under KV pressure. Every simulated sequence sampled
  the same token (sim.runner.SIMULATED_TOKEN_ID), so two requests with one prompt got one continuation and shared
  its full blocks in the prefix cache; the engine's samples differ. A preempted one was re-admitted on the other's
  generated blocks in the simulator only (step 30 of 117: three rows against two). Fixed in the main session: with
  the replay's sampling given (sim.replay --temperature, SimConfig), each sequence's first token is its own
  (sim.runner.first_token_id), which chains every block of its continuation apart; the later tokens stay one (the
  lazy and quiet-window paths need that). Greedy requests keep the common token: identical prompts continue alike
  (on the CPU; a GPU's greedy rows may part).
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("polars")

from cli.engine_replay import main as engine_replay  # noqa: E402
from engine.core.records import SCHEDULE_COLUMNS  # noqa: E402
from traces.schema import load_trace, save_trace  # noqa: E402

COMPARED = (*SCHEDULE_COLUMNS, "prefill_attention_pairs", "max_decode_context_tokens", "continues_batch", "ran_ahead")
REQUEST_COLUMNS = ["request_id", "prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions",
                   "finish_reason"]


class AheadCostModel:
    """A millisecond a step, from a profile of an engine that runs ahead (engine_features.runs_decode_ahead)."""

    name = "a millisecond a step, run ahead"
    runs_decode_ahead = True

    def step_time_s(self, batch, host_slowdown=None) -> float:
        return 1e-3


def _row(i: int, prompt: int, output: int, **columns) -> dict:
    return {"request_id": f"r{i:02d}", "arrival_s": 0.0, "prompt_tokens": prompt, "output_tokens": output, **columns}


def _shared(seed: int, n: int, longest: int, most_output: int) -> list[dict]:
    """``n`` requests whose prompts share up to 4 leading 16-token hash blocks in three groups."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = rng.randint(5, longest)
        blocks = -(-prompt // 16)
        shared = min(blocks, rng.randint(0, 4))
        rows.append(_row(i, prompt, rng.randint(1, most_output),
                         hash_ids=[1000 * (i % 3) + b for b in range(shared)]
                         + [100_000 + 100 * i + b for b in range(blocks - shared)]))
    return rows


def _multi_turn() -> list[dict]:
    """Three sessions of three turns: each turn's prompt is the one before it and more (a block or so short)."""
    rows = []
    for session in range(3):
        for turn in range(3):
            blocks = 3 + 4 * turn
            rows.append(_row(len(rows), 16 * blocks - 5 * (turn % 2), 8 + 3 * turn,
                             hash_ids=[5000 * session + b for b in range(blocks)]))
    return rows


_SAME = [random.Random(5).randrange(500) for _ in range(64)]

# name: (rows, --policy, --block-size, --num-gpu-blocks, --max-model-len, --max-num-seqs, --max-num-batched-tokens)
CASES = {
    # 10 requests, 14 blocks of 16: preemptions, requests waiting that do not fit (the run-ahead difference)
    "kv-pressure-16": (_shared(1, 8, 200, 30), "mixed", 16, 14, 256, 3, 48),
    "kv-pressure-nano-32": (_shared(2, 8, 200, 30), "nano", 32, 7, 224, 2, 256),
    # blocks of 256, one sequence at a time, prompts longer than the budget
    "block-256-one-seq": (_shared(3, 6, 400, 30), "mixed", 256, 2, 512, 1, 96),
    # identical prompts, a multiple of the block size: each request but the first hits all but the last block
    "identical-prompts": ([_row(i, 64, 20 + i, prompt_token_ids=_SAME) for i in range(5)], "mixed", 16, 12, 256,
                          3, 64),
    # max_tokens 1, chunks ending exactly where the prompts do (the budget is the shortest prompt)
    "one-token-chunks": ([_row(i, 32 * (1 + i % 3), 1) for i in range(8)], "mixed", 32, 8, 256, 3, 32),
    # cut by max_model_len (a prompt as long as it gets its one token uncut), by the KV cache, and by the budget
    "cuts-max-model-len": ([_row(0, 40, 50), _row(1, 64, 5), _row(2, 63, 1), _row(3, 63, 3), _row(4, 30, 34),
                            _row(5, 30, 35)], "mixed", 16, 20, 64, 2, 64),
    "cuts-kv-capacity": ([_row(0, 40, 100), _row(1, 30, 10), _row(2, 64, 1), _row(3, 20, 44)], "mixed", 16, 4, 256,
                         2, 64),
    "cuts-token-budget": ([_row(0, 40, 100), _row(1, 30, 10), _row(2, 64, 1)], "nano", 16, 20, 256, 2, 64),
    "multi-turn-32": (_multi_turn(), "mixed", 32, 8, 256, 2, 48),
    "multi-turn-nano": (_multi_turn(), "nano", 16, 16, 256, 3, 192),
    # 40 running sequences: the scheduler's large-batch path, the simulator's lazy tokens and quiet windows
    "large-batch": (_shared(4, 44, 40, 30), "mixed", 16, 70, 256, 40, 128),
}


@pytest.mark.parametrize("case", list(CASES))
def test_offline_simulation_forms_the_real_batches_and_marks_the_steps_it_ran_ahead(tiny_qwen3, tmp_path, case):
    """Step tables equal column for column, ran_ahead included (against a profile of an engine that runs ahead),
    and the requests' cached tokens, preemptions and finish reasons (each cut named alike)."""
    from sim.config import SimConfig
    from sim.simulator import simulate

    rows, policy, block_size, num_blocks, max_model_len, max_num_seqs, budget = CASES[case]
    model_dir, _ = tiny_qwen3
    trace_path = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame(rows), trace_path, hash_block_size=16 if "hash_ids" in rows[0] else None)
    options = {"policy": policy, "block_size": block_size, "num_gpu_blocks": num_blocks,
               "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget}
    flags = [text for key, value in options.items() for text in (f"--{key.replace('_', '-')}", str(value))]
    assert engine_replay([str(trace_path), "--model", model_dir, "--offline", *flags, "--quiet", "--no-report",
                          "--warmup-requests", "0", "--out", str(tmp_path / "real")]) == 0
    result = simulate(load_trace(trace_path).offline(), SimConfig(model=model_dir, **options),
                      cost_model=AheadCostModel())
    real = pl.read_parquet(tmp_path / "real" / "steps.parquet").select(COMPARED)
    simulated = pl.from_arrow(result.steps_table()).select(COMPARED)
    assert real.height > 4
    assert real.equals(simulated), f"{case}: the simulated schedule differs from the real one"
    real_requests = pl.read_parquet(tmp_path / "real" / "requests.parquet").select(REQUEST_COLUMNS).sort("request_id")
    simulated_requests = pl.from_arrow(result.requests_table()).select(REQUEST_COLUMNS).sort("request_id")
    assert real_requests.equals(simulated_requests)
    if case.startswith("cuts-"):
        assert real_requests["finish_reason"].str.contains(case.removeprefix("cuts-").replace("-", "_")).any()
    if case == "kv-pressure-16":  # the case that found it: continuing steps while requests waited that did not fit
        assert (real["continues_batch"] - real["ran_ahead"]).sum() > 50 and real["num_preempted"].sum() > 0


def test_identical_prompts_sampled_under_kv_pressure(tiny_qwen3, tmp_path):
    from sim.config import SimConfig
    from sim.simulator import simulate

    rng = random.Random(5)
    same = [rng.randrange(500) for _ in range(40)]
    rows = [_row(i, 40, 30 + 3 * i, prompt_token_ids=same if i % 2 == 0 else [rng.randrange(500) for _ in range(40)])
            for i in range(6)]
    trace_path = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame(rows), trace_path)
    options = {"block_size": 16, "num_gpu_blocks": 10, "max_model_len": 256, "max_num_seqs": 3,
               "max_num_batched_tokens": 64}
    flags = [text for key, value in options.items() for text in (f"--{key.replace('_', '-')}", str(value))]
    model_dir, _ = tiny_qwen3
    assert engine_replay([str(trace_path), "--model", model_dir, "--offline", *flags, "--quiet", "--no-report",
                          "--warmup-requests", "0", "--temperature", "0.7", "--out", str(tmp_path / "real")]) == 0
    result = simulate(load_trace(trace_path).offline(), SimConfig(model=model_dir, temperature=0.7, **options),
                      cost_model=AheadCostModel())
    real = pl.read_parquet(tmp_path / "real" / "steps.parquet").select(COMPARED)
    assert real["num_preempted"].sum() > 0
    assert real.equals(pl.from_arrow(result.steps_table()).select(COMPARED))
    # Simulated as greedy (one token for every row), the two requests of one prompt shared their continuations'
    # blocks, and the schedules parted at step 30
    greedy = simulate(load_trace(trace_path).offline(), SimConfig(model=model_dir, **options),
                      cost_model=AheadCostModel())
    assert not real.equals(pl.from_arrow(greedy.steps_table()).select(COMPARED))
