"""``python -m sim.replay`` end to end: the files it writes, and every option taking effect."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl
import pytest

from analysis.metrics import add_latency_columns, summarize
from cli.sim_replay import build_parser
from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import (
    SHAREGPT,
    SUMMARY_STAT_KEYS,
    assert_frames_equal,
    read_outputs,
    run_cli,
    without_wall_clock,
)
from traces.schema import load_trace

SUMMARY_KEYS = (
    "num_requests", "num_finished", "num_rejected", "duration_s", "request_throughput", "output_throughput",
    "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "num_preemptions", "prefix_cache_hit_rate", "peak_kv_usage",
    "cost_model", "config",
)
LATENCY_SUMMARY_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
REQUEST_COLUMNS = (
    "request_id", "replica", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "prompt_tokens",
    "output_tokens", "cached_tokens", "num_preemptions", "finish_reason", "reject_reason", "token_times_s",
    "ttft_s", "tpot_s", "e2e_s", "queue_s",
)
STEP_COLUMNS = (
    "replica", "step", "num_seqs", "num_prefill_seqs", "num_prefill_tokens", "prefill_context_tokens",
    "num_decode_seqs", "decode_context_tokens", "num_batched_tokens", "num_running", "num_waiting",
    "num_kv_blocks_used", "num_preempted", "num_finished", "start_s", "duration_s", "kv_usage",
)
LIMIT = 200  # requests of the default trace in each option run: enough load for every option to show


def test_default_trace_end_to_end(tmp_path) -> None:
    """The documented command on the whole default trace, in a child process."""
    out = tmp_path / "out"
    proc = run_cli(["traces/sharegpt.parquet", "--out", out, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""  # --quiet: no progress bar, no table
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "requests.parquet", "steps.parquet", "summary.json"]

    requests, steps, summary = read_outputs(out)
    for key in SUMMARY_KEYS:
        assert key in summary, key
    for key in LATENCY_SUMMARY_KEYS:
        assert set(SUMMARY_STAT_KEYS) <= set(summary[key]), key
        assert all(isinstance(summary[key][stat], float) and summary[key][stat] > 0 for stat in SUMMARY_STAT_KEYS)
        assert summary[key]["p50"] <= summary[key]["p90"] <= summary[key]["p99"]
    assert summary["num_requests"] == requests.height == 2000
    assert summary["num_finished"] + summary["num_rejected"] == 2000
    assert summary["num_steps"] == steps.height
    assert summary["duration_s"] > 0 and summary["request_throughput"] > 0 and summary["output_throughput"] > 0
    assert 0 < summary["prefix_cache_hit_rate"] < 1 and 0 < summary["peak_kv_usage"] <= 1
    assert summary["num_preemptions"] == int(requests["num_preemptions"].sum())
    assert summary["trace"] == "traces/sharegpt.parquet"
    config = summary["config"]
    defaults = dict(model="qwen3-0.6b", gpu="h200", num_replicas=1, router="rr", policy="mixed", max_num_seqs=256,
                    max_num_batched_tokens=8192, block_size=256, enable_prefix_caching=True, seed=0)
    assert {k: config[k] for k in defaults} == defaults
    assert config["max_model_len"] == 40960 and config["num_gpu_blocks"] > 0

    assert set(REQUEST_COLUMNS) <= set(requests.columns)
    assert set(STEP_COLUMNS) <= set(steps.columns)
    assert requests["arrival_s"].is_sorted()
    assert all(requests[c].null_count() == 0 for c in ("ttft_s", "e2e_s", "queue_s"))
    assert (requests["e2e_s"] >= requests["ttft_s"]).all()
    html = (out / "report.html").read_text()
    assert html.lstrip().lower().startswith("<!doctype html") and len(html) > 10_000


def test_progress_and_summary_table_without_quiet(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert replay_main([str(SHAREGPT), "--limit", "30", "--out", str(out), "--no-report"]) == 0
    captured = capsys.readouterr()
    assert str(out) in captured.out and "cost model" in captured.out
    assert "simulating" in captured.err  # the progress bar
    assert not (out / "report.html").exists()


def test_default_out_dir_is_under_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert replay_main([str(SHAREGPT), "--limit", "10", "--quiet", "--no-report"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("sim-sharegpt-")
    assert json.loads((run_dir / "summary.json").read_text())["num_requests"] == 10


# ---- every option takes effect --------------------------------------------------------------------


@dataclass
class Run:
    requests: pl.DataFrame
    steps: pl.DataFrame
    summary: dict

    @property
    def config(self) -> dict:
        return self.summary["config"]

    @property
    def arrival_span_s(self) -> float:
        return float(self.requests["arrival_s"].max() - self.requests["arrival_s"].min())

    @property
    def tpot_ms(self) -> float:
        return self.summary["tpot_ms"]["mean"]


def _run(tmp_path, name: str, options: list[str], limit: int | None = LIMIT) -> Run:
    out = tmp_path / name
    args = [str(SHAREGPT), "--out", str(out), "--quiet", "--no-report", *options]
    if limit is not None and "--limit" not in options:
        args += ["--limit", str(limit)]
    assert replay_main(args) == 0
    assert not (out / "report.html").exists()
    return Run(*read_outputs(out))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("baseline"), "baseline", [])


def _check_model(run: Run, base: Run) -> None:
    assert run.config["model"] == "qwen3-8b"
    assert run.tpot_ms > 2 * base.tpot_ms  # 8B weights stream ~13x the bytes of 0.6B per decode step


def _check_gpu(run: Run, base: Run) -> None:
    assert run.config["gpu"] == "h100"
    assert run.config["num_gpu_blocks"] < base.config["num_gpu_blocks"]  # 80 GB, not 141 GB
    assert run.tpot_ms > base.tpot_ms  # less memory bandwidth


def _check_replicas_lor(run: Run, base: Run) -> None:
    assert (run.config["num_replicas"], run.config["router"]) == (2, "lor")
    assert set(run.requests["replica"].to_list()) == {0, 1}
    assert set(run.steps["replica"].to_list()) == {0, 1}
    assert run.summary["num_finished"] == LIMIT


def _check_replicas_rr(run: Run, base: Run) -> None:
    assert (run.config["num_replicas"], run.config["router"]) == (3, "rr")
    ordered = run.requests.sort(pl.col("request_id").cast(pl.Int64))  # request ids are the arrival order here
    assert ordered["replica"].to_list() == [i % 3 for i in range(LIMIT)]


def _check_qps(run: Run, base: Run) -> None:
    assert run.arrival_span_s == pytest.approx((LIMIT - 1) / 50.0)
    assert run.requests["request_id"].to_list() == base.requests["request_id"].to_list()  # same order


def _check_time_scale(run: Run, base: Run) -> None:
    assert run.arrival_span_s == pytest.approx(0.5 * base.arrival_span_s)


def _check_offline(run: Run, base: Run) -> None:
    assert run.arrival_span_s == 0.0
    assert run.summary["num_finished"] == LIMIT


def _check_limit(run: Run, base: Run) -> None:
    assert run.summary["num_requests"] == run.requests.height == 37
    assert run.requests["request_id"].to_list() == base.requests["request_id"].head(37).to_list()


def _check_policy(run: Run, base: Run) -> None:
    assert run.config["policy"] == "nano"
    both = (pl.col("num_prefill_seqs") > 0) & (pl.col("num_decode_seqs") > 0)
    assert run.steps.filter(both).height == 0  # nano: all-prefill or all-decode
    assert base.steps.filter(both).height > 0  # mixed: both in one step


def _check_max_num_seqs(run: Run, base: Run) -> None:
    assert run.config["max_num_seqs"] == 4
    assert int(run.steps["num_seqs"].max()) == 4 < int(base.steps["num_seqs"].max())


def _check_max_num_batched_tokens(run: Run, base: Run) -> None:
    assert run.config["max_num_batched_tokens"] == 512
    assert int(run.steps["num_batched_tokens"].max()) == 512 < int(base.steps["num_batched_tokens"].max())
    # Prompts over 512 tokens were prefilled in chunks: more prefill steps than prefilled requests.
    assert run.steps["num_prefill_seqs"].sum() > base.steps["num_prefill_seqs"].sum()


def _check_block_size(run: Run, base: Run) -> None:
    assert run.config["block_size"] == 16
    cached = run.requests["cached_tokens"]
    assert (cached % 16 == 0).all() and (cached % 256 != 0).any()
    assert cached.sum() > base.requests["cached_tokens"].sum()  # finer blocks reuse more of each prefix
    # The cache is sized from GPU memory: 16x the blocks of 256 tokens (up to rounding).
    assert 16 * base.config["num_gpu_blocks"] <= run.config["num_gpu_blocks"] < 16 * (base.config["num_gpu_blocks"] + 1)


def _check_num_gpu_blocks(run: Run, base: Run) -> None:
    assert run.config["num_gpu_blocks"] == 64
    assert int(run.steps["num_kv_blocks_used"].max()) == 64
    assert (run.steps["kv_usage"] == run.steps["num_kv_blocks_used"] / 64).all()
    assert run.summary["peak_kv_usage"] == 1.0
    assert run.summary["num_preemptions"] > 0 == base.summary["num_preemptions"]
    assert run.summary["num_finished"] + run.summary["num_rejected"] == LIMIT


def _check_max_model_len(run: Run, base: Run) -> None:
    assert run.config["max_model_len"] == 1024
    rejected = run.requests.filter(pl.col("finish_reason") == "rejected")
    assert rejected.height > 0 and (rejected["prompt_tokens"] > 1024).all()
    served = run.requests.filter(pl.col("finish_reason") != "rejected")
    assert (served["prompt_tokens"] + served["output_tokens"] <= 1024).all()
    assert served.height + rejected.height == LIMIT


def _check_allow_long_max_model_len(run: Run, base: Run) -> None:
    # Past qwen3-0.6b's 40,960 positions only with the switch (without it: tests/sim/test_cli_errors.py).
    assert run.config["max_model_len"] == 100_000 and run.config["allow_long_max_model_len"] is True
    assert run.requests["finish_reason"].to_list() == base.requests["finish_reason"].to_list()


def _check_gpu_memory_utilization(run: Run, base: Run) -> None:
    assert run.config["gpu_memory_utilization"] == 0.5
    assert run.config["num_gpu_blocks"] < 0.6 * base.config["num_gpu_blocks"]


def _check_tensor_parallel_size(run: Run, base: Run) -> None:
    assert run.config["tensor_parallel_size"] == 2
    # Against the same model on one GPU (qwen3-8b on an h100, roofline as the TP=2 run): more KV per GPU, faster decode.
    single = simulate(load_trace(SHAREGPT).head(LIMIT), SimConfig(model="qwen3-8b", gpu="h100", cost_model="roofline"))
    assert run.config["num_gpu_blocks"] > single.scheduler_config.num_gpu_blocks  # half the KV heads per GPU
    requests = add_latency_columns(pl.from_arrow(single.requests_table()))
    assert run.tpot_ms < summarize(requests, None)["tpot_ms"]["mean"]  # half the weights to stream per GPU


def _check_no_prefix_caching(run: Run, base: Run) -> None:
    assert run.config["enable_prefix_caching"] is False
    # No cache, no hit rate (vLLM reports none); cached tokens are a count, and none were cached.
    assert run.summary["prefix_cache_hit_rate"] is None and run.requests["cached_tokens"].sum() == 0
    assert base.summary["prefix_cache_hit_rate"] > 0


def _check_seed(run: Run, base: Run) -> None:
    # The default trace carries hash_ids, which fix its prompt tokens: the seed is only echoed.
    assert run.config["seed"] == 7


def _check_cost_model(run: Run, base: Run) -> None:
    assert run.summary["cost_model"] == run.config["cost_model"] == "roofline-estimate"


def _check_slo(run: Run, base: Run) -> None:
    # Goodput, as vLLM's request_goodput: the finished requests within every limit, per second of the run.
    from analysis.metrics import goodput_rps
    from analysis.slo import parse_slos

    expected = goodput_rps(run.requests, parse_slos("ttft_p50=25ms,tpot_p90=50ms"))
    assert run.summary["goodput"] == run.summary["request_goodput"] == pytest.approx(expected, rel=1e-5)
    assert 0 < expected < run.summary["request_throughput"]  # a tight TTFT limit: some requests miss it
    assert run.summary["slos_ms"] == {"ttft_p50": 25.0, "tpot_p90": 50.0}
    assert base.summary["request_goodput"] is None and "goodput" not in base.summary


def _check_metric_percentiles(run: Run, base: Run) -> None:
    # vLLM's option: its percentiles replace p99 in the flat names, as numpy's over the finished requests.
    from analysis.stats import round_sig

    ttfts_ms = run.requests.filter(pl.col("finish_reason").is_in(["stop", "length"]))["ttft_s"].to_numpy() * 1e3
    assert run.summary["p90_ttft_ms"] == round_sig(float(np.percentile(ttfts_ms, 90)))
    assert run.summary["metric_percentiles"] == [90.0, 99.5] and "p99.5_e2el_ms" in run.summary
    assert "p99_ttft_ms" not in run.summary and base.summary["metric_percentiles"] == [99.0]
    assert run.requests.equals(base.requests)  # a choice of statistics, not of the replay


def _check_sampling(run: Run, base: Run) -> None:
    # Recorded as engine.replay records them. The shipped profile prices the sampling where it measured it; a profile
    # measured before sampled points prices the greedy steps and says so (tests/sim/test_sampling_cost.py has both).
    from sim.profiled_cost_model import ProfiledCostModel, profile_path

    assert {k: run.config.get(k) for k in ("temperature", "top_k", "top_p")} == {"temperature": 0.6, "top_k": 20,
                                                                                 "top_p": 0.95}
    assert base.config["temperature"] == 0.0 and "top_k" not in base.config and "top_p" not in base.config
    assert not base.summary["warnings"]
    model = ProfiledCostModel.load(profile_path("qwen3-0.6b", "h200"), sampling="filters")
    if not model._sampling_sizes:
        assert [w["code"] for w in run.summary["warnings"]] == ["sampling_not_measured"]
        assert run.steps.equals(base.steps)
        return
    # A sampled point measured faster than its greedy twin is named (sim.limits, sampling_below_greedy)
    filters = [p for p in json.loads(profile_path("qwen3-0.6b", "h200").read_text())["sampling_points"]
               if p["sampling"] == "filters"]
    suspect = any(p["median_s"] < 0.9 * p["greedy_median_s"] for p in filters)
    assert [w["code"] for w in run.summary["warnings"]] == (["sampling_below_greedy"] if suspect else [])
    # Each step takes what its sampling rows add (the shipped profile's filters: 1.4-3.4 ms at 32-256 rows), and slower
    # steps batch the arrivals otherwise: checked on the run here; step by step, on one schedule, in
    # tests/sim/test_sampling_cost.py.
    decode = pl.col("num_prefill_tokens") == 0
    assert run.steps.filter(decode)["duration_s"].mean() > base.steps.filter(decode)["duration_s"].mean()
    assert run.tpot_ms > base.tpot_ms


def _check_host_slowdown(run: Run, base: Run) -> None:
    # x3 against the profile's calibrated host factor: an eager step's host part grows by 3 / factor, its GPU
    # part not at all, so the steps that carry prefill take longer, by less than 3 / factor.
    from sim.profiled_cost_model import calibration_label, profile_path

    assert run.config["host_slowdown"] == "3" and base.config["host_slowdown"] == "calibrated"
    host_factor = json.loads(profile_path("qwen3-0.6b", "h200").read_text())["serving"]["host_factor"]
    eager = pl.col("num_prefill_tokens") > 0
    ratio = run.steps.filter(eager)["duration_s"].median() / base.steps.filter(eager)["duration_s"].median()
    assert 1.5 < ratio < 3 / host_factor, (ratio, host_factor)
    assert run.tpot_ms > base.tpot_ms
    # The name quoted the calibrated host factor ("serving-calibrated (host x0.83, ...)") the run did not use.
    serving = json.loads(profile_path("qwen3-0.6b", "h200").read_text())["serving"]
    calibration = f"serving-calibrated ({calibration_label(serving)})"  # 'host x0.83, 6 machine sessions'
    calibrated = base.summary["cost_model"]
    assert calibrated.endswith(f", {calibration}") and f"host x{host_factor:.2f}" in calibration
    expected = calibrated.replace(f", {calibration}", ", host slowdown 3 (--host-slowdown, not the serving-calibrated "
                                                      f"{calibration_label(serving)})")
    assert run.summary["cost_model"] == run.config["cost_model"] == expected


def _check_bands(run: Run, base: Run) -> None:
    # The main run's outputs are the unperturbed replay's; the bands only add their own key.
    assert_frames_equal(run.requests, base.requests, "requests")
    assert_frames_equal(run.steps, base.steps, "steps")
    bands = run.summary.pop("bands")
    assert without_wall_clock(run.summary) == without_wall_clock(base.summary)
    assert bands["num_replays"] == 3 and bands["seed"] == 0
    ttft = bands["metrics"]["ttft_ms"]["p50"]
    assert ttft["p5"] <= ttft["median"] <= ttft["p95"] and ttft["p5"] < ttft["p95"]  # the replays differ


OPTION_CASES: dict[str, tuple[list[str], Callable[[Run, Run], None]]] = {
    "model": (["--model", "qwen3-8b"], _check_model),
    "gpu": (["--gpu", "h100"], _check_gpu),
    "replicas-lor": (["--replicas", "2", "--router", "lor"], _check_replicas_lor),
    "replicas-rr": (["--replicas", "3", "--router", "rr"], _check_replicas_rr),
    "qps": (["--qps", "50"], _check_qps),
    "time-scale": (["--time-scale", "0.5"], _check_time_scale),
    "offline": (["--offline"], _check_offline),
    "limit": (["--limit", "37"], _check_limit),
    "policy": (["--policy", "nano"], _check_policy),
    "max-num-seqs": (["--max-num-seqs", "4"], _check_max_num_seqs),
    "max-num-batched-tokens": (["--max-num-batched-tokens", "512"], _check_max_num_batched_tokens),
    "block-size": (["--block-size", "16"], _check_block_size),
    "num-gpu-blocks": (["--num-gpu-blocks", "64"], _check_num_gpu_blocks),
    "max-model-len": (["--max-model-len", "1024"], _check_max_model_len),
    "allow-long-max-model-len": (["--max-model-len", "100000", "--allow-long-max-model-len"],
                                 _check_allow_long_max_model_len),
    "gpu-memory-utilization": (["--gpu-memory-utilization", "0.5"], _check_gpu_memory_utilization),
    # Both under the roofline: the base run uses the measured TP=1 profile, and there is none for TP=2 here.
    "tensor-parallel-size": (["--tensor-parallel-size", "2", "--model", "qwen3-8b", "--gpu", "h100"],
                             _check_tensor_parallel_size),
    "no-prefix-caching": (["--no-prefix-caching"], _check_no_prefix_caching),
    "seed": (["--seed", "7"], _check_seed),
    "cost-model": (["--cost-model", "roofline"], _check_cost_model),
    "host-slowdown": (["--host-slowdown", "3"], _check_host_slowdown),
    "slo": (["--slo", "ttft_p50=25ms,tpot_p90=50ms"], _check_slo),
    "metric-percentiles": (["--metric-percentiles", "90,99.5"], _check_metric_percentiles),
    "bands": (["--bands", "3"], _check_bands),
    "sampling": (["--temperature", "0.6", "--top-k", "20", "--top-p", "0.95"], _check_sampling),
}
# Exercised by every run above (and by test_default_trace_end_to_end / test_progress_... without them).
ALWAYS_USED = {"--out", "--quiet", "--no-report", "--overwrite"}  # --overwrite: tests/sim/test_outputs.py


def _parser_options() -> set[str]:
    return {
        option
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


@pytest.mark.parametrize("case", list(OPTION_CASES))
def test_option_takes_effect(tmp_path, baseline, case) -> None:
    options, check = OPTION_CASES[case]
    missing = {o for o in options if o.startswith("--")} - _parser_options()
    if missing:
        pytest.skip(f"sim.replay has no {', '.join(sorted(missing))} option")
    check(_run(tmp_path, case, options), baseline)


def test_every_option_in_help_is_exercised() -> None:
    exercised = ALWAYS_USED | {o for options, _ in OPTION_CASES.values() for o in options if o.startswith("--")}
    untested = _parser_options() - exercised
    assert not untested, f"options of python -m sim.replay --help without a test here: {sorted(untested)}"
