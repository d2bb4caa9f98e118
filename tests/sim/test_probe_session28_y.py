"""Session 28, probe Y: multi-replica replays (--replicas N behind every router, prefix caching on and off,
fast-forward on and off) checked against figures worked out by hand or computed independently.

Finding (fixed):

- A run stopped by a watch (analysis.capacity's certain miss) at the very instant a step ended. Input: two requests at
  t=0 (16-token prompts, 40 and 6 output tokens) on a quarter-second-a-step cost model, one replica or two behind
  lor or rr, stopped at 2.5 s (the end of step 9). Before: the step loop had the long request in flight with 10
  tokens and 10 steps logged on its replica (simpy runs every event already due at 2.5 s before the watch's stop),
  the fast-forwarded run 9 tokens and 9 steps (QuietRun.stop kept only steps that ended strictly before the stop);
  a seeded fuzz of stops on step ends parted on 14 of 400 runs, one to six replicas, every router. Now: both have
  10 tokens and 10 steps, as a stop at 2.6 s gives; the fuzz parts on none of 1,400.

Checked and found right (pinned here): round robin's replica per request (rejections are never routed, and keep
replica 0); the prefix router's choice and the cached-token counts of requests.parquet and summary.json on a
hand-made trace, and its fallback to load with the cache off; N replicas of a trace spread far apart in time equal N
single-replica runs (host episodes seeded per replica); summary.json's counts, throughputs, percentiles and KV figures
recomputed from requests.parquet and steps.parquet for three replicas behind each router; a fleet with idle replicas
(no NaN, steps only where requests went); fast-forward on and off byte-identical on hand-made multi-replica traces
with arrivals on step ends; hostile --replicas and --router values refused in one line naming the bound or the
valid names.
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import QUARTER_STEP_S as STEP_S
from tests.sim.helpers import (
    QuarterSecondSteps,
    StopAt,
    make_trace,
    read_outputs,
    result_tables,
    trace_frame,
    write_trace,
)
from tests.traces.helpers import cli_error
from traces.schema import Trace


def _tables(result) -> tuple[bytes, bytes]:
    return result.requests_table(), result.steps_table()


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("deployment", [{}, {"num_replicas": 2, "router": "lor"},
                                        {"num_replicas": 2, "router": "rr"}], ids=["one", "two-lor", "two-rr"])
@pytest.mark.parametrize("stop_s", [2.5, 2.6])
def test_a_stop_at_the_very_end_of_a_step_keeps_that_step(stop_s, deployment, fast_forward):
    """Step 9 ends at 2.5 s: stopped then, it is complete (the step loop runs every event due at 2.5 s before the
    stop), as stopped 0.1 s later. Fast-forwarded, the stop at 2.5 s kept 9 steps and 9 tokens of the long one."""
    config = SimConfig(block_size=16, host_slowdown="1", **deployment)
    result = simulate(make_trace([16, 16], [40, 6]), config, cost_model=QuarterSecondSteps(),
                      fast_forward=fast_forward, watch=StopAt(stop_s))
    assert result.stopped_s == stop_s
    requests, steps = result_tables(result)
    long, short = requests.sort("request_id").iter_rows(named=True)
    assert (long["output_tokens"], long["finish_s"], long["finish_reason"]) == (10, None, None)
    assert long["token_times_s"] == [STEP_S * k for k in range(1, 11)]
    assert (short["output_tokens"], short["finish_s"], short["finish_reason"]) == (6, 1.5, "length")
    # One replica: both requests in each of its ten steps; two: the long one's ten, the short one's six on the other.
    assert steps.height == {1: 10, 2: 10 + 6}[config.num_replicas]
    assert (steps["start_s"] + steps["duration_s"]).max() == 2.5


@pytest.mark.parametrize("router", ["rr", "lor", "prefix"])
def test_stops_on_step_ends_give_the_same_tables_fast_forwarded(router):
    """Three replicas, arrivals and stops on quarter-second step ends: the step loop and fast-forward agree."""
    trace = make_trace([20, 40, 16, 90, 33, 16, 64], [120, 80, 3, 150, 1, 60, 90],
                       [0.0, 0.0, 0.25, 0.5, 1.0, 1.0, 2.75])
    config = SimConfig(block_size=16, host_slowdown="1", num_replicas=3, router=router)
    for stop_s in (0.5, 3.0, 7.25, 20.0):
        stepped = simulate(trace, config, cost_model=QuarterSecondSteps(), fast_forward=False, watch=StopAt(stop_s))
        forwarded = simulate(trace, config, cost_model=QuarterSecondSteps(), watch=StopAt(stop_s))
        assert forwarded.num_fast_forward_steps > 0 or stop_s <= 0.5
        assert all(a.equals(b) for a, b in zip(_tables(stepped), _tables(forwarded))), stop_s


@pytest.mark.parametrize("fast_forward", [False, True])
def test_round_robin_skips_rejected_requests(fast_forward):
    """Requests 1 and 4 are longer than max_model_len: turned away before routing (replica 0 in their rows), so the
    others go to replicas 0, 1, 2, 0, 1, 2 in arrival order."""
    trace = make_trace([100, 5000, 200, 300, 5000, 50, 60, 70], [5] * 8, [10.0 * i for i in range(8)])
    config = SimConfig(num_replicas=3, router="rr", max_model_len=1024)
    requests, _ = result_tables(simulate(trace, config, fast_forward=fast_forward))
    assert requests["replica"].to_list() == [0, 0, 1, 2, 0, 0, 1, 2]
    assert requests["finish_reason"].to_list() == ["length", "rejected", "length", "length", "rejected", "length",
                                                   "length", "length"]


PREFIX_TRACE = dict(prompt_tokens=[48, 32, 48, 64], output_tokens=[2, 2, 3, 3], arrival_s=[0.0, 0.0, 10.0, 10.0],
                    hash_ids=[[1, 2, 3], [5, 6], [5, 6, 7], [1, 2, 3, 9]])


@pytest.mark.parametrize(("router", "caching", "replicas", "cached"), [
    # A [1,2,3] -> 0; C [5,6] -> 1 (replica 0 busy); at 10 s B [5,6,7] finds 2 blocks on 1, D [1,2,3,9] 3 on 0.
    ("prefix", True, [0, 1, 1, 0], [0, 0, 32, 48]),
    ("prefix", False, [0, 1, 0, 1], [0, 0, 0, 0]),  # no cache: least outstanding, then lowest index
    ("rr", True, [0, 1, 2, 0], [0, 0, 0, 48]),  # D lands on A's replica by turn
    ("lor", True, [0, 1, 0, 1], [0, 0, 0, 0]),
])
def test_prefix_router_sends_shared_prefixes_where_they_are_cached(tmp_path, router, caching, replicas, cached):
    trace = write_trace(tmp_path / "t.parquet", *PREFIX_TRACE.values(), hash_block_size=16)
    out = tmp_path / "out"
    args = [str(trace), "--replicas", "3", "--router", router, "--block-size", "16", "--out", str(out), "--quiet",
            "--no-report"]
    assert replay_main(args + ([] if caching else ["--no-prefix-caching"])) == 0
    requests, steps, summary = read_outputs(out)
    requests = requests.sort("request_id")
    assert requests["replica"].to_list() == replicas
    assert requests["cached_tokens"].to_list() == cached
    assert summary["total_cached_tokens"] == sum(cached)
    # No cache, no hit rate (vLLM reports none without one; 0.0 read as a cache that missed).
    assert summary["prefix_cache_hit_rate"] == (round(sum(cached) / 192, 6) if caching else None)
    assert sorted(set(steps["replica"].to_list())) == sorted(set(replicas))


@pytest.mark.parametrize("host", ["calibrated", "1.3", "episodes:1.0,1.8,0.3,2.0"])
@pytest.mark.parametrize("fast_forward", [False, True])
def test_far_apart_requests_on_n_replicas_equal_n_single_replica_runs(host, fast_forward):
    """Round robin over 3 replicas, one request every 1000 s: replica r's rows and steps are those of a one-replica
    run of requests r, r + 3, ... (its host episodes drawn from --seed + r)."""
    n, num_replicas = 10, 3
    rng = np.random.default_rng(5)
    prompts = rng.integers(1, 300, n).tolist()
    frame = trace_frame(prompts, rng.integers(1, 120, n).tolist(), (np.arange(n) * 1000.0 + rng.random(n)).tolist(),
                        [[int(h) for h in rng.integers(1, 4, (p + 15) // 16)] for p in prompts])
    config = SimConfig(num_replicas=num_replicas, router="rr", block_size=16, host_slowdown=host)
    requests, steps = result_tables(simulate(Trace.from_frame(frame, "all", 16), config, fast_forward=fast_forward))
    for r in range(num_replicas):
        alone = simulate(Trace.from_frame(frame[list(range(r, n, num_replicas))], "one", 16),
                         SimConfig(block_size=16, host_slowdown=host, seed=r), fast_forward=fast_forward)
        alone_requests, alone_steps = result_tables(alone)
        assert requests.filter(pl.col("replica") == r).drop("replica").equals(alone_requests.drop("replica"))
        assert steps.filter(pl.col("replica") == r).drop("replica").equals(alone_steps.drop("replica"))


def _sig(value: float) -> float:
    return float(f"{value:.6g}")


@pytest.mark.parametrize("router", ["rr", "lor", "prefix"])
def test_summary_equals_figures_recomputed_from_the_tables(tmp_path, router):
    """Three replicas, a small cache (preemptions) and a request too long for it: every headline figure of
    summary.json is what numpy computes from requests.parquet and steps.parquet."""
    rng = np.random.default_rng(11)
    n = 90
    prompts = rng.integers(1, 900, n).tolist() + [5000]
    trace = write_trace(tmp_path / "t.parquet", prompts, rng.integers(1, 400, n + 1).tolist(),
                        sorted(rng.uniform(0, 1, n + 1).tolist()),
                        hash_ids=[[int(h) for h in rng.integers(1, 4, (p + 15) // 16)] for p in prompts],
                        hash_block_size=16)
    out = tmp_path / "out"
    assert replay_main([str(trace), "--replicas", "3", "--router", router, "--block-size", "16", "--num-gpu-blocks",
                        "80", "--out", str(out), "--quiet", "--no-report"]) == 0
    requests, steps, summary = read_outputs(out)
    finished = requests.filter(pl.col("finish_reason").is_in(["stop", "length"]))
    admitted = requests.filter(pl.col("finish_reason") != "rejected")
    duration_s = max(requests["finish_s"].max(), max(max(t) for t in finished["token_times_s"].to_list())) - \
        requests["arrival_s"].min()
    assert summary["num_rejected"] == 1
    assert summary["num_preemptions"] == admitted["num_preemptions"].sum() > 0
    assert summary["duration_s"] == _sig(duration_s)
    assert summary["request_throughput"] == _sig(finished.height / duration_s)
    assert summary["output_throughput"] == _sig(finished["output_tokens"].sum() / duration_s)
    for key, column in (("total_prompt_tokens", "prompt_tokens"), ("total_output_tokens", "output_tokens"),
                        ("total_cached_tokens", "cached_tokens")):
        assert summary[key] == admitted[column].sum()
    assert summary["num_steps"] == steps.height
    assert summary["peak_kv_usage"] == _sig(steps["kv_usage"].max())
    assert summary["mean_kv_usage"] == _sig((steps["kv_usage"] * steps["duration_s"]).sum() / steps["duration_s"].sum())
    ttft = (finished["first_token_s"] - finished["arrival_s"]).to_numpy()
    e2e = (finished["finish_s"] - finished["arrival_s"]).to_numpy()
    tokens = finished["output_tokens"].to_numpy()
    samples = {
        "ttft": ttft, "e2e": e2e, "queue": (finished["first_scheduled_s"] - finished["arrival_s"]).to_numpy(),
        "tpot": (e2e - ttft)[tokens > 1] / (tokens[tokens > 1] - 1),
        "itl": np.concatenate([np.diff(np.asarray(t)) for t in finished["token_times_s"].to_list()]),
    }
    for metric, values in samples.items():
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        assert summary[f"{metric}_ms"] == {"p50": _sig(p50 * 1e3), "p90": _sig(p90 * 1e3), "p99": _sig(p99 * 1e3),
                                          "mean": _sig(values.mean() * 1e3)}, metric


@pytest.mark.parametrize("router", ["rr", "lor", "prefix"])
def test_idle_replicas_contribute_nothing_odd(tmp_path, router):
    """Four requests on six replicas: two (or, behind lor and prefix, more) replicas never get one; no figure is NaN
    or infinite, and the step log holds only the replicas that served."""
    trace = write_trace(tmp_path / "t.parquet", [100, 200, 300, 50], [5, 6, 7, 8], [0.0, 0.1, 0.2, 0.3])
    out = tmp_path / "out"
    assert replay_main([str(trace), "--replicas", "6", "--router", router, "--out", str(out), "--quiet"]) == 0
    requests, steps, summary = read_outputs(out)
    assert set(steps["replica"].to_list()) == set(requests["replica"].to_list())
    assert summary["num_finished"] == 4 and summary["num_steps"] == steps.height

    def finite(value) -> bool:
        if isinstance(value, dict):
            return all(finite(v) for v in value.values())
        return not isinstance(value, float) or math.isfinite(value)

    assert finite(json.loads((out / "summary.json").read_text()))
    assert "NaN" not in (out / "summary.json").read_text()


@pytest.mark.parametrize(("value", "expected"), [
    ("0", "error: --replicas: num_replicas must be an integer >= 1, got 0"),
    ("-3", "error: --replicas: num_replicas must be an integer >= 1, got -3"),
    ("1000000", "error: --replicas: num_replicas must be at most 10,000, got 1000000"),
    ("1.5", "error: argument --replicas: invalid int value: '1.5' (--help lists the options)"),
    ("1e3", "error: argument --replicas: invalid int value: '1e3' (--help lists the options)"),
])
def test_hostile_replica_counts_are_one_line(tmp_path, capsys, value, expected):
    trace = write_trace(tmp_path / "t.parquet", [100], [5])
    out = tmp_path / "out"
    assert cli_error(replay_main, [str(trace), "--replicas", value, "--out", str(out), "--quiet"], capsys) == expected
    assert not out.exists()


@pytest.mark.parametrize("router", ["round-robin", "RR", "", "prefx"])
def test_a_misspelt_router_lists_the_valid_names(tmp_path, capsys, router):
    trace = write_trace(tmp_path / "t.parquet", [100], [5])
    line = cli_error(replay_main, [str(trace), "--router", router, "--out", str(tmp_path / "o"), "--quiet"], capsys)
    assert line == (f"error: argument --router: invalid choice: '{router}' (choose from 'lor', 'prefix', 'rr') "
                    "(--help lists the options)")
