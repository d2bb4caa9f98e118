"""Session 29, probe C: traces of extreme but legal shape (10,000 requests at one instant, arrivals 1e-9 s apart,
arrivals spread over 1e6 s, one request, 1-token prompts, prompts at max_model_len - 1, max_model_len and beyond,
outputs of 1 and 10**6 tokens, one huge prompt ahead of small ones, multi-turn hash ids and stored token ids) replayed
with --replicas 1-4 behind every router, both policies and KV caches of a few blocks, each output checked against
figures computed from requests.parquet and steps.parquet, and fast-forward on against off.

Finding (fixed):

- The printed summary (and report.html's table, from the same formatter) showed a nonzero figure as a measured 0.
  Input: 200 requests spread over 1e6 s (arrivals spanning days), or one request on the default cache. Before:
  ``request throughput      0.000 req/s`` (summary.json: 0.000201748) and ``KV usage peak / mean    0.0 % / 0.0 %``
  (0.00022). After: ``0.0002017 req/s`` and ``0.022 % / 0.022 %``: a figure its fixed decimals would show as 0 gets
  significant digits (analysis.report.summary_table.format_field).

Checked and found right (pinned here compactly): every request served or rejected with a reason, counted in
summary.json (reject_reasons, num_cut, finish_reasons); a prompt of max_model_len - 1 gets one token, cut
(max_model_len), one of max_model_len asking one token gets it, one beyond is rejected; an output of 10**6 is cut at
max_model_len and says so; preemptions under a cache of a few blocks agree between requests.parquet, steps.parquet
and summary.json, and every run ends; summary.json's counts, durations, throughputs and percentiles equal what the
tables give; fast-forward on and off give identical tables on these shapes (1,600 seeded fuzz runs found no
difference).

Not fixed (reported): with --max-num-seqs 1 (or 2) a replay of traces/sharegpt.parquet takes 26 s (14 s), not 1 s,
because no quiet window forms while a request waits (engine.core.quiet_window needs an empty waiting queue, even
when no waiting request can be admitted): 0.1 % of 654,608 steps fast-forwarded. The lor and prefix routers read
every replica at every arrival: 10,000 requests on 1,000 replicas take 39-48 s (rr: 15 s).
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analysis.report.summary_table import format_field
from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import (
    assert_conserved,
    assert_frames_equal,
    assert_steps_within_limits,
    make_trace,
    read_outputs,
    result_tables,
    write_trace,
)

MAX_MODEL_LEN = 40960  # qwen3-0.6b's


def _replay(tmp_path, capsys, trace_path, *args) -> str:
    out = tmp_path / "out"
    assert replay_main([str(trace_path), "--out", str(out), "--no-report", *map(str, args)]) == 0
    return capsys.readouterr().out


def test_a_trace_spanning_days_prints_its_throughput_not_zero(tmp_path, capsys):
    """Three requests over 1e6 s: 3e-6 req/s, printed as 0.000 req/s; the KV usage of one small request on the
    default cache (0.02 %) as 0.0 %."""
    trace = write_trace(tmp_path / "days.parquet", [100, 100, 100], [50, 50, 50], [0.0, 5e5, 1e6])
    printed = _replay(tmp_path, capsys, trace)
    _, _, summary = read_outputs(tmp_path / "out")
    assert 0 < summary["request_throughput"] < 1e-5 and 0 < summary["peak_kv_usage"] < 1e-3
    lines = {line[:24].strip(): line[24:] for line in printed.splitlines()}
    assert lines["request throughput"] == f"{summary['request_throughput']:.4g} req/s", printed
    assert lines["output throughput"] == f"{summary['output_throughput']:.4g} tok/s", printed
    peak, mean = (f"{summary[key] * 100:.2g} %" for key in ("peak_kv_usage", "mean_kv_usage"))
    assert lines["KV usage peak / mean"] == f"{peak} / {mean}", printed


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("request_throughput", 0.0, "0.000 req/s"),  # a measured 0 stays one
    ("request_throughput", 12.5, "12.500 req/s"),
    ("request_throughput", 4e-7, "4e-07 req/s"),
    ("duration_s", 0.001, "0.001 s"),
    ("prefix_cache_hit_rate", 0.0, "0.0 %"),
    ("prefix_cache_hit_rate", 0.25, "25.0 %"),
    ("mean_kv_usage", 3e-5, "0.003 %"),
    ("num_steps", 0, "0"),
    ("goodput", None, "-"),
])
def test_format_field_keeps_fixed_decimals_unless_they_read_zero(key, value, shown):
    assert format_field({key: value}, key) == shown


def _edge_trace_args() -> tuple[list[int], list[int], list[float]]:
    """A burst at one instant, arrivals 1e-9 s apart, 1-token prompts and outputs, the max_model_len edges, an
    output of 10**6 and one huge prompt ahead of small ones."""
    rng = np.random.default_rng(29)
    burst = 200
    prompts = [int(x) for x in rng.integers(1, 3000, burst)] + [1] * 20 + [
        MAX_MODEL_LEN - 1, MAX_MODEL_LEN - 1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1, 10**6, 5, 30000] + [40] * 30
    outputs = [int(x) for x in rng.integers(1, 400, burst)] + [1] * 20 + [1, 2, 1, 1, 1, 10**6, 500] + [20] * 30
    arrivals = [0.0] * burst + [1.0 + i * 1e-9 for i in range(20)] + [2.0] * 7 + [2.0 + i * 1e-9 for i in range(30)]
    return prompts, outputs, arrivals


def test_edge_shapes_are_served_or_rejected_and_summarized_as_the_tables_say(tmp_path, capsys):
    prompts, outputs, arrivals = _edge_trace_args()
    trace = write_trace(tmp_path / "edges.parquet", prompts, outputs, arrivals)
    _replay(tmp_path, capsys, trace, "--quiet", "--slo", "ttft_p90=2s,tpot_p90=50ms")
    requests, steps, summary = read_outputs(tmp_path / "out")
    assert_conserved(requests, range(len(prompts)))
    by_id = {row["request_id"]: row for row in requests.iter_rows(named=True)}
    edge = len(prompts) - 37
    assert [by_id[str(edge + k)]["finish_reason"] for k in range(6)] == [
        "length", "max_model_len", "length", "rejected", "rejected", "max_model_len"]
    assert by_id[str(edge + 1)]["output_tokens"] == 1
    assert by_id[str(edge + 5)]["prompt_tokens"] + by_id[str(edge + 5)]["output_tokens"] == MAX_MODEL_LEN
    served = requests.filter(pl.col("finish_reason") != "rejected")
    assert (served["ttft_s"] >= served["queue_s"]).all()
    assert all(np.all(np.diff(times) > 0) for times in served["token_times_s"].to_list())
    assert summary["num_rejected"] == 2 and sum(summary["reject_reasons"].values()) == 2
    assert summary["num_cut"] == 2 == summary["finish_reasons"]["max_model_len"]
    assert summary["num_finished"] == served.height and summary["num_steps"] == steps.height
    assert int(steps["num_finished"].sum()) == served.height
    duration_s = float(requests["finish_s"].max() - requests["arrival_s"].min())
    assert summary["duration_s"] == pytest.approx(duration_s, rel=1e-6)
    assert summary["request_throughput"] == pytest.approx(served.height / duration_s, rel=1e-5)
    assert summary["output_throughput"] == pytest.approx(served["output_tokens"].sum() / duration_s, rel=1e-5)
    for metric in ("ttft", "tpot", "e2e", "queue"):
        values = served[f"{metric}_s"].drop_nulls().to_numpy() * 1e3
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            assert summary[f"{metric}_ms"][name] == pytest.approx(np.percentile(values, q), rel=1e-5, abs=1e-9)
        assert summary[f"{metric}_ms"]["mean"] == pytest.approx(values.mean(), rel=1e-5, abs=1e-9)
    meets = served.filter((pl.col("ttft_s") <= 2) & ((pl.col("tpot_s") <= 0.05) | pl.col("tpot_s").is_null()))
    assert summary["goodput"] == pytest.approx(meets.height / duration_s, rel=1e-5)


@pytest.mark.parametrize(("policy", "replicas", "router"), [("mixed", 1, "rr"), ("nano", 3, "lor"),
                                                            ("mixed", 3, "prefix")])
def test_a_preemption_storm_ends_and_every_table_counts_it_alike(tmp_path, capsys, policy, replicas, router):
    """A burst on a cache of six 16-token blocks per replica: prompts of 1-90 tokens, outputs up to 120."""
    rng = np.random.default_rng(7)
    n = 120
    trace = write_trace(tmp_path / "storm.parquet", [int(x) for x in rng.integers(1, 90, n)],
                        [int(x) for x in rng.integers(1, 120, n)], [0.0] * 60 + [0.5 + i * 1e-9 for i in range(60)])
    _replay(tmp_path, capsys, trace, "--quiet", "--num-gpu-blocks", 6, "--block-size", 16, "--policy", policy,
            "--replicas", replicas, "--router", router)
    requests, steps, summary = read_outputs(tmp_path / "out")
    assert_conserved(requests, range(n))
    assert_steps_within_limits(steps, max_num_seqs=256, max_num_batched_tokens=8192, num_gpu_blocks=6)
    preemptions = int(requests["num_preemptions"].sum())
    assert preemptions > 0
    assert int(steps["num_preempted"].sum()) == preemptions == summary["num_preemptions"]
    cut = requests.filter(pl.col("finish_reason") == "kv_capacity")
    assert (cut["prompt_tokens"] + cut["output_tokens"] == 6 * 16).all()


@pytest.mark.parametrize("deployment", [
    {},
    {"num_gpu_blocks": 12, "block_size": 16, "policy": "nano"},
    {"num_replicas": 2, "router": "prefix", "block_size": 16},
    {"num_replicas": 3, "router": "lor", "num_gpu_blocks": 40, "block_size": 16, "max_num_seqs": 2},
], ids=["default", "tiny-cache-nano", "prefix-2", "lor-3-small"])
def test_fast_forward_changes_nothing_on_extreme_shapes(deployment):
    """Bursts at one instant, 1e-9 s gaps, a 1e6 s idle gap and shared hash-id prefixes, stepped and fast-forwarded."""
    rng = np.random.default_rng(3)
    n = 90
    prompts = [int(x) for x in rng.integers(1, 600, n)]
    arrivals = sorted([0.0] * 30 + [1e6 + i * 1e-9 for i in range(30)] + list(rng.uniform(0, 2, 30)))
    hash_ids = [[j if j < 3 else 1000 * i + j for j in range(-(-p // 64))] for i, p in enumerate(prompts)]
    trace = make_trace(prompts, [int(x) for x in rng.integers(1, 300, n)], arrivals, hash_ids, 64)
    config = SimConfig(**deployment)
    fast, stepped = simulate(trace, config), simulate(trace, config, fast_forward=False, lazy_tokens=False)
    assert fast.num_fast_forward_steps > 0
    for (left, right), what in zip(zip(result_tables(fast), result_tables(stepped)), ("requests", "steps")):
        assert_frames_equal(left, right, what)
    assert_conserved(result_tables(fast)[0], range(n))
