"""Probe (thirty-first session, E): differential fuzzing of engine.replay on the CPU against sim.replay, offline
(every request at t=0), step by step: the schedule columns (SCHEDULE_COLUMNS and OPTIONAL_SCHEDULE_COLUMNS), each
request's prompt and output tokens, cached tokens, preemptions and finish reason, and the step that scheduled each
request and gave it each token. Random cases over the tiny Llama, Qwen2 and Qwen3, both policies, blocks of 16, 32
and 256, caches small enough to preempt (mid-prompt and mid-decode), max_num_seqs 1-8, 16 and 256, token budgets of
1-3 tokens and up, prefix caching on and off, prompts repeated, extended (turns) and cut to another's prefix (block
multiples), prompts at max_model_len, outputs of 1 and 2 tokens and ones max_model_len cuts, batches of 33-70 running
rows (the scheduler's large-batch path, the simulator's lazy tokens and quiet windows), trace hash ids, warm-ups,
--no-run-ahead, sampling (temperatures, top-k, top-p); tensor_parallel_size 2 over gloo by hand.

Found:

- top_k=1 leaves the draw one token: the engine's sampler takes the argmax under any temperature, so requests of one
  prompt continue alike, as greedy ones do, and a preempted one comes back on another's generated KV blocks in the
  prefix cache. The simulator gave each such request a first token of its own (sim.runner.first_token_id, as it must
  for real sampling: tests/engine/test_probe_session29_b.py), so those blocks hashed apart: it recomputed what the
  engine took from the cache (three requests of one prompt under KV pressure: 91 steps where the engine ran 76, the
  engine's own greedy run's 76). Fixed: engine.core.sampling_params.samples_argmax, which the simulator asks.
- By design, not changed: where the engine's tokens decide a prefix-cache hit, the simulator (whose tokens are its
  own) cannot follow. Greedy, a trace's next prompt whose first token after a shared 15-token prefix happened to be
  the tiny model's greedy token hit the engine's generated block (1 case in ~300); sampled with the tiny random
  models' peaked distributions (top_p 0.5, temperature 0.7), requests of one prompt drew the same first tokens and
  shared blocks the simulator keeps apart (2 cases). Without prefix caching, or with distinct prompts, every sampled
  case matched.
"""

from __future__ import annotations

import pytest

from engine.core.sampling_params import samples_argmax

torch = pytest.importorskip("torch")
pl = pytest.importorskip("polars")

from cli.engine_replay import main as engine_replay  # noqa: E402
from cli.sim_replay import main as sim_replay  # noqa: E402
from engine.core.records import OPTIONAL_SCHEDULE_COLUMNS, SCHEDULE_COLUMNS  # noqa: E402
from traces.schema import save_trace  # noqa: E402


def test_which_options_sample_the_argmax():
    assert samples_argmax(0.0, -1) and samples_argmax(1e-6, 50) and samples_argmax(1.0, 1) and samples_argmax(2.0, 1)
    assert not samples_argmax(1.0, -1) and not samples_argmax(0.7, 2) and not samples_argmax(1.0, 0)


def test_top_k_1_requests_of_one_prompt_share_their_generated_blocks_in_the_simulation_too(tiny_qwen3, tmp_path):
    model_dir, _ = tiny_qwen3
    prompt = list(range(1, 21))
    trace = tmp_path / "same_prompt.parquet"
    save_trace(pl.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0] * 3, "prompt_tokens": [20] * 3,
                             "output_tokens": [60] * 3, "prompt_token_ids": [prompt] * 3}), trace)
    options = [str(trace), "--model", model_dir, "--offline", "--block-size", "16", "--max-model-len", "128",
               "--max-num-batched-tokens", "64", "--max-num-seqs", "8", "--num-gpu-blocks", "9",
               "--temperature", "1.0", "--top-k", "1", "--quiet", "--no-report"]
    assert engine_replay([*options, "--out", str(tmp_path / "real"), "--warmup-requests", "0"]) == 0
    assert sim_replay([*options, "--out", str(tmp_path / "sim")]) == 0
    compared = SCHEDULE_COLUMNS + OPTIONAL_SCHEDULE_COLUMNS
    real = pl.read_parquet(tmp_path / "real" / "steps.parquet").select(compared)
    sim = pl.read_parquet(tmp_path / "sim" / "steps.parquet").select(compared)
    assert real["num_preempted"].sum() > 0  # the recompute that reads the cache
    assert (real.height, real["num_prefill_tokens"].sum()) == (sim.height, sim["num_prefill_tokens"].sum())
    assert real.equals(sim)
    columns = ["request_id", "output_tokens", "cached_tokens", "num_preemptions", "finish_reason"]
    assert pl.read_parquet(tmp_path / "real" / "requests.parquet").select(columns).sort("request_id").equals(
        pl.read_parquet(tmp_path / "sim" / "requests.parquet").select(columns).sort("request_id"))


class _StepCost:
    """A millisecond a step: the schedule is what is compared, not its times."""

    name = "a millisecond a step"

    def step_time_s(self, batch, host_slowdown=None) -> float:
        return 1e-3


def _fuzz_case(seed: int) -> tuple[list[dict], dict, list[str]]:
    """A small random offline case: its trace rows, the options of both replays, and the engine's own flags. Sampling
    is greedy, top_k=1 (the argmax too), or a temperature with the prefix cache off (no sample can matter then)."""
    import random

    rng = random.Random(seed)
    block_size = rng.choice([16, 32])
    max_model_len = rng.choice([33, 48, 64, 96])
    prompts: list[list[int]] = []
    for _ in range(rng.randint(3, 7)):
        kind = rng.random()
        if prompts and kind < 0.25:
            prompt = list(rng.choice(prompts))  # the same prompt again
        elif prompts and kind < 0.4:
            source = rng.choice(prompts)  # another's prefix: a block multiple where it has one
            prompt = source[:block_size] if len(source) > block_size else source[:rng.randint(1, len(source))]
        elif prompts and kind < 0.6:
            prompt = rng.choice(prompts) + [rng.randrange(500) for _ in range(rng.randint(1, block_size))]  # a turn
        else:
            length = rng.choice([1, block_size - 1, block_size, block_size + 1, max_model_len,
                                 rng.randint(2, max_model_len)])
            prompt = [rng.randrange(500) for _ in range(length)]
        prompts.append(prompt[:max_model_len])
    rows = [{"request_id": f"r{i}", "arrival_s": 0.0, "prompt_tokens": len(p), "prompt_token_ids": p,
             "output_tokens": rng.choice([1, 2, rng.randint(3, 24), 500])} for i, p in enumerate(prompts)]
    policy = rng.choice(["mixed", "nano"])
    longest = max(len(p) for p in prompts)
    options = {"policy": policy, "block_size": block_size, "max_model_len": max_model_len,
               "max_num_seqs": rng.choice([1, 2, 3, 5, 8]),
               "max_num_batched_tokens": (rng.choice([longest, 64, 128]) if policy == "nano"
                                          else rng.choice([1, 2, 3, 7, 16, 40])),
               "num_gpu_blocks": -(-longest // block_size) + rng.choice([0, 1, 2, 4]),
               "enable_prefix_caching": rng.random() < 0.7}
    sampling = rng.choice([{}, {"temperature": 0.8, "top_k": 1}, {"temperature": 0.8, "top_p": 0.9}])
    if sampling.get("top_p"):
        options["enable_prefix_caching"] = False
    options.update(sampling)
    flags = ["--warmup-requests", str(rng.choice([0, 2]))] + (["--no-run-ahead"] if rng.random() < 0.3 else [])
    return rows, options, flags


# Seeds of _fuzz_case picked for cheap cases (under 40 steps each) that between them preempt (3, 20), hit the prefix
# cache (3, 12, 32; 12 and 32 under top_k=1), run token budgets of 3 (32) and one sequence at a time (28), warm up
# first (3, 12, 28) and cut requests by max_model_len and by nano's token budget.
@pytest.mark.parametrize("seed", [3, 12, 20, 28, 32])
def test_random_small_offline_cases_schedule_alike(request, tmp_path, seed):
    """Seeded random small cases over the three tiny models (Llama's and Qwen2's outside test_replay's Qwen3):
    token budgets of 1-3 (a prompt's last token alone), one sequence at a time, caches that preempt, prompts that
    repeat, extend or prefix one another, outputs of 1 and 2 tokens and ones max_model_len cuts, warm-ups."""
    from sim.config import SimConfig
    from sim.simulator import simulate
    from traces.schema import load_trace

    rows, options, flags = _fuzz_case(seed)
    model_dir, _ = request.getfixturevalue(("tiny_qwen3", "tiny_llama", "tiny_qwen2")[seed % 3])
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame(rows), trace)
    cli = [str(trace), "--model", model_dir, "--offline", "--quiet", "--no-report", "--out", str(tmp_path / "real")]
    for key, value in options.items():
        if key == "enable_prefix_caching":
            cli += [] if value else ["--no-prefix-caching"]
        else:
            cli += [f"--{key.replace('_', '-')}", str(value)]
    assert engine_replay([*cli, *flags]) == 0
    result = simulate(load_trace(trace).offline(), SimConfig(model=model_dir, **options), cost_model=_StepCost())
    compared = SCHEDULE_COLUMNS + OPTIONAL_SCHEDULE_COLUMNS
    real = pl.read_parquet(tmp_path / "real" / "steps.parquet").select(compared)
    assert real.equals(pl.from_arrow(result.steps_table()).select(compared)), f"seed {seed}: {options} {flags}"
    columns = ["request_id", "prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions", "finish_reason"]
    assert pl.read_parquet(tmp_path / "real" / "requests.parquet").select(columns).sort("request_id").equals(
        pl.from_arrow(result.requests_table()).select(columns).sort("request_id"))
