"""Conservation: every request finishes or is rejected (once), whatever the cache size, policy or routing,
and no step breaks the batch limits."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import (
    SHAREGPT,
    assert_conserved,
    assert_steps_within_limits,
    make_trace,
    read_outputs,
    result_tables,
    write_trace,
)
from traces.schema import load_trace

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 12  # 192 tokens of KV cache per replica: a handful of requests at a time
MAX_MODEL_LEN = 320  # more than the cache holds, so "needs more blocks than exist" is its own case
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 128

TOO_LONG = 400  # > max_model_len
TOO_MANY_BLOCKS = 250  # <= max_model_len, but needs 16 blocks of 16 tokens and the cache has 12
NEEDS_CHUNKING = 150  # fits the cache, but only in chunks of max_num_batched_tokens (nano cannot chunk)


def _tiny_cache_trace():
    """Bursts of small requests (so the cache overflows and running sequences get preempted), with
    requests that can never be served scattered among them."""
    rng = np.random.default_rng(0)
    n = 60
    prompts = rng.integers(5, 121, n).tolist()
    outputs = rng.integers(1, 151, n).tolist()
    arrivals = [0.05 * (i // 10) for i in range(n)]  # 6 bursts of 10 simultaneous requests
    special = {7: TOO_LONG, 18: TOO_MANY_BLOCKS, 33: NEEDS_CHUNKING, 51: TOO_LONG}
    for row, prompt in special.items():
        prompts[row] = prompt
    return make_trace(prompts, outputs, arrivals), special


def _config(policy: str, num_replicas: int = 1, router: str = "rr") -> SimConfig:
    return SimConfig(
        policy=policy,
        num_replicas=num_replicas,
        router=router,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )


@pytest.mark.parametrize("policy", ["mixed", "nano"])
@pytest.mark.parametrize(("num_replicas", "router"), [(1, "rr"), (3, "rr"), (3, "lor")])
def test_tiny_cache_every_request_finishes_or_is_rejected(policy, num_replicas, router) -> None:
    trace, special = _tiny_cache_trace()
    config = _config(policy, num_replicas, router)
    result = simulate(trace, config)
    requests, steps = result_tables(result)

    assert_conserved(requests, trace.requests["request_id"].to_list())
    requests = requests.with_columns(pl.col("request_id").cast(pl.Int64)).sort("request_id")

    # Exactly the impossible requests are rejected, each with its reason.
    expected_reasons = {row: "max_model_len" for row, n in special.items() if n == TOO_LONG}
    expected_reasons[18] = "KV blocks"
    if policy == "nano":
        expected_reasons[33] = "does not chunk"
    rejected = requests.filter(pl.col("finish_reason") == "rejected")
    assert rejected["request_id"].to_list() == sorted(expected_reasons)
    for row, reason in zip(rejected["request_id"], rejected["reject_reason"]):
        assert expected_reasons[row] in reason, (row, reason)

    # Everyone else got its full output, cut only where prompt + output would outgrow what one
    # sequence may hold (max_model_len, the whole cache, and for nano one step's token budget).
    max_seq_len = min(MAX_MODEL_LEN, NUM_GPU_BLOCKS * BLOCK_SIZE)
    if policy == "nano":
        max_seq_len = min(max_seq_len, MAX_NUM_BATCHED_TOKENS)
    served = requests.filter(pl.col("finish_reason") != "rejected")
    wanted = trace.requests.select(pl.col("request_id"), pl.col("output_tokens").alias("wanted"))
    served = served.join(wanted, on="request_id")
    expected_output = pl.min_horizontal(pl.col("wanted"), max_seq_len - pl.col("prompt_tokens"))
    assert served.select((pl.col("output_tokens") == expected_output).all()).item()
    # ignore_eos: only lengths stop requests; a cut one says which limit cut it.
    cut_by = "max_model_len" if MAX_MODEL_LEN <= max_seq_len else "kv_capacity"
    cut_by = "token_budget" if policy == "nano" else cut_by
    cut = served["wanted"] > max_seq_len - served["prompt_tokens"]
    assert cut.any() and not cut.all()
    assert served["finish_reason"].to_list() == [cut_by if c else "length" for c in cut]

    # The cache was too small for the bursts: requests were preempted, and still all finished.
    num_preemptions = int(requests["num_preemptions"].sum())
    assert num_preemptions > 0
    assert int(steps["num_preempted"].sum()) == num_preemptions
    assert (steps["num_kv_blocks_used"] == NUM_GPU_BLOCKS).any()  # the cache did fill up

    assert_steps_within_limits(
        steps,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        num_gpu_blocks=NUM_GPU_BLOCKS,
    )
    # Each replica finished everything it was given.
    assert set(steps["replica"].unique().to_list()) == set(range(num_replicas))
    assert set(requests["replica"].unique().to_list()) == set(range(num_replicas))
    if router == "rr":  # round robin over arrival order; a request no replica can serve is turned away first
        served = requests.filter(pl.col("finish_reason") != "rejected").sort("request_id")
        assert served["replica"].to_list() == [i % num_replicas for i in range(served.height)]


def test_tiny_cache_through_the_cli(tmp_path, capsys) -> None:
    """The same conservation, read back from requests.parquet and summary.json."""
    trace, special = _tiny_cache_trace()
    trace_path = write_trace(
        tmp_path / "tiny.parquet",
        trace.requests["prompt_tokens"].to_list(),
        trace.requests["output_tokens"].to_list(),
        trace.requests["arrival_s"].to_list(),
    )
    out = tmp_path / "out"
    rc = replay_main([
        str(trace_path), "--out", str(out), "--quiet", "--no-report", "--replicas", "3", "--router", "lor",
        "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks", str(NUM_GPU_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
    ])
    assert rc == 0
    requests, steps, summary = read_outputs(out)
    assert_conserved(requests, trace.requests["request_id"].to_list())
    assert requests["request_id"].n_unique() == requests.height == len(trace)
    assert summary["num_requests"] == len(trace)
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"]
    assert summary["num_rejected"] == 3
    assert sum(summary["reject_reasons"].values()) == 3
    assert any("max_model_len" in reason for reason in summary["reject_reasons"])
    assert any("KV blocks" in reason for reason in summary["reject_reasons"])
    assert summary["num_preemptions"] == int(requests["num_preemptions"].sum()) > 0
    assert summary["peak_kv_usage"] == pytest.approx(1.0)
    assert_steps_within_limits(
        steps, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, num_gpu_blocks=NUM_GPU_BLOCKS
    )
    assert json.loads((out / "summary.json").read_text()) == summary


@pytest.mark.parametrize("policy", ["mixed", "nano"])
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_every_prompt_and_output_token_is_computed_once(policy, prefix_caching) -> None:
    """Without preemptions, the steps compute each prompt token not served from the prefix cache once,
    and one token per output token after the first (sampled at the end of the prefill)."""
    trace = load_trace(SHAREGPT).head(300).with_qps(20.0)
    # Limits tight enough to bind under this load; nano's budget must hold the longest prompt (11.9k).
    budget = 2048 if policy == "mixed" else 16384
    config = SimConfig(
        policy=policy, enable_prefix_caching=prefix_caching, max_num_seqs=24, max_num_batched_tokens=budget
    )
    requests, steps = result_tables(simulate(trace, config))
    assert_conserved(requests, trace.requests["request_id"].to_list())
    assert requests["num_preemptions"].sum() == 0
    assert (requests["finish_reason"] == "length").all()
    assert requests["output_tokens"].to_list() == trace.requests["output_tokens"].to_list()
    cached = int(requests["cached_tokens"].sum())
    assert (cached > 0) == prefix_caching  # the trace is multi-turn: later turns resend earlier ones
    expected = int(requests["prompt_tokens"].sum()) - cached + int((requests["output_tokens"] - 1).sum())
    assert int(steps["num_batched_tokens"].sum()) == expected
    assert int(steps["num_finished"].sum()) == len(trace)
    # cached_tokens is whole blocks, and at least one prompt token is always computed.
    assert (requests["cached_tokens"] % config.block_size == 0).all()
    assert (requests["cached_tokens"] < requests["prompt_tokens"]).all()
    assert_steps_within_limits(
        steps,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_gpu_blocks=result_num_blocks(config),
    )
    assert int(steps["num_seqs"].max()) == config.max_num_seqs  # the limits were reached, not just respected
    if policy == "mixed":
        assert int(steps["num_batched_tokens"].max()) == config.max_num_batched_tokens
    if policy == "nano":  # a nano step is all-prefill or all-decode
        assert ((steps["num_prefill_seqs"] == 0) | (steps["num_decode_seqs"] == 0)).all()
    else:  # mixed steps do occur under this load
        assert ((steps["num_prefill_seqs"] > 0) & (steps["num_decode_seqs"] > 0)).any()


def result_num_blocks(config: SimConfig) -> int:
    return config.resolved_for(config.model_shape).num_gpu_blocks


def test_nano_decode_steps_respect_the_token_budget() -> None:
    # 200 short prompts at once, max_num_seqs above the token budget: decode steps batch every running sequence.
    trace = make_trace([40] * 200, [20] * 200)
    config = SimConfig(policy="nano", max_num_seqs=256, max_num_batched_tokens=64, block_size=16, num_gpu_blocks=10000)
    requests, steps = result_tables(simulate(trace, config))
    assert_conserved(requests, list(range(200)))
    assert int(steps["num_batched_tokens"].max()) <= 64
