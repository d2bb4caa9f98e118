"""summary.json's ``warnings`` (sim.limits): exact warnings on small crafted runs, none on a normal one, and
printed by the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.cost_model import num_kv_blocks_for
from sim.hardware import get_gpu
from sim.limits import grid_range, saturation_warning, skew_warning
from sim.profiled_cost_model import fit_profile, profile_path, write_profile
from tests.sim.helpers import SHAREGPT, write_trace

PROFILE = profile_path("qwen3-0.6b", "h200")


def _run(tmp_path: Path, trace: Path, *args: str, name: str = "out") -> dict:
    out = tmp_path / name
    assert replay_main([str(trace), "--out", str(out), "--quiet", "--no-report", *args]) == 0
    return json.loads((out / "summary.json").read_text())


def _tiny_profile(tmp_path: Path) -> Path:
    """The committed profile cut to a small grid: decode batches of up to 8 at contexts up to 1024, and
    single prefills of up to 1024 new tokens without a cached prefix."""
    profile = json.loads(PROFILE.read_text())
    keep = []
    for p in profile["points"]:
        f = p["features"]
        decode_only = f["num_prefill_tokens"] == 0
        if decode_only and p["family"] == "decode" and f["num_decode_seqs"] <= 8 and \
                f["max_decode_context_tokens"] <= 1024 + 16:
            keep.append(p)
        elif p["family"] == "prefill" and f["num_prefill_tokens"] <= 1024 and f["prefill_context_tokens"] == 0:
            keep.append(p)
    profile["points"] = keep
    profile["serving"] = None
    profile["fit"] = fit_profile(profile)
    path = tmp_path / "tiny.json"
    write_profile(path, profile)
    return path


def test_a_batch_beyond_a_tiny_grid_is_named_with_its_figures(tmp_path: Path) -> None:
    profile = _tiny_profile(tmp_path)
    grid = grid_range(json.loads(profile.read_text()))
    assert (grid.eager_batch_tokens, grid.eager_num_seqs, grid.prefill_context_tokens) == (1024, 1, 1024)
    assert (grid.decode_num_seqs, grid.longest_decode_context) == (8, 1027)
    # One request of 3,000 prompt tokens: one prefill step of 3,000 tokens, then decodes at ~3,000 context.
    trace = write_trace(tmp_path / "t.parquet", [3000], [4])
    summary = _run(tmp_path, trace, "--cost-model", str(profile), "--offline")
    assert summary["warnings"] == [
        {"code": "beyond_grid_batch_tokens",
         "message": "1 of 4 steps (25.0%) have eager batches of tokens up to 3,000, beyond the profile grid's largest "
                    "measured 1,024: their times are extrapolated",
         "value": 3000, "limit": 1024},
        {"code": "beyond_grid_prefill_context",
         "message": "1 of 4 steps (25.0%) have prefill context (cached + new tokens, summed over the step's "
                    "prefills) up to 3,000, beyond the profile grid's largest measured 1,024: their times are "
                    "extrapolated",
         "value": 3000, "limit": 1024},
        {"code": "beyond_grid_decode_context",
         "message": "3 of 4 steps (75.0%) have a longest decode context up to 3,003, beyond the profile grid's "
                    "largest measured 1,027: their times are extrapolated",
         "value": 3003, "limit": 1027},
    ]
    assert [w["code"] for w in summary["warnings"]] == [
        "beyond_grid_batch_tokens", "beyond_grid_prefill_context", "beyond_grid_decode_context"]


def test_a_normal_run_has_no_warnings(tmp_path: Path) -> None:
    summary = _run(tmp_path, SHAREGPT, "--limit", "100", "--qps", "10")
    assert summary["warnings"] == []


def test_a_block_count_beyond_memory_is_flagged(tmp_path: Path) -> None:
    config = SimConfig()
    holds = num_kv_blocks_for(config.model_shape, get_gpu("h200"), 256, 1.0, 8192, 1)
    assert holds > num_kv_blocks_for(config.model_shape, get_gpu("h200"), 256, 0.9, 8192, 1) + 400
    summary = _run(tmp_path, SHAREGPT, "--limit", "20", "--qps", "10", "--num-gpu-blocks", str(holds + 1))
    assert summary["warnings"] == [{
        "code": "kv_blocks_beyond_memory",
        "message": f"--num-gpu-blocks {holds + 1:,} is more KV blocks than all of the memory of 1x h200 holds beside "
                   f"qwen3-0.6b ({holds:,} blocks of 256 tokens): a what-if no real engine could run",
        "value": holds + 1, "limit": holds}]
    # All of the memory, not the engine's estimate at --gpu-memory-utilization 0.9: the GPU runs of the
    # validation had up to 4,526 blocks, 9 over that estimate.
    assert _run(tmp_path, SHAREGPT, "--limit", "20", "--qps", "10", "--num-gpu-blocks", str(holds),
                name="at_limit")["warnings"] == []


def test_an_overloaded_run_is_past_saturation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 600 prompts of 8,000 tokens at 100 req/s: prefill-bound at under 30 req/s, so the queue grows throughout
    # (the figures below follow the committed qwen3-0.6b profile).
    n = 600
    trace = write_trace(tmp_path / "t.parquet", [8000] * n, [10] * n, [i / 100 for i in range(n)])
    out = tmp_path / "out"
    assert replay_main([str(trace), "--out", str(out), "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    warning = {"code": "past_saturation", "value": 143.5, "limit": 20.0,  # 10 % of the 200 arrivals in 3.99-5.99 s
               "message": "replica 0's waiting queue grew by 143 requests (+71.85/s, least-squares trend; 290 -> 431 "
                          "waiting) over the last third of the arrivals (4.0-6.0 s), at least 10% of the 200 that "
                          "arrived then: the load exceeds what it serves, and latencies grow with the run's length"}
    assert summary["warnings"] == [warning]
    assert f"warning [past_saturation]: {warning['message']}" in capsys.readouterr().out.splitlines()


def test_no_profile_is_a_warning_and_another_models_profile_an_error(tmp_path: Path) -> None:
    summary = _run(tmp_path, SHAREGPT, "--limit", "20", "--qps", "10", "--cost-model", "roofline")
    assert summary["warnings"] == [{
        "code": "no_profile", "value": None, "limit": None,
        "message": "cost model: the roofline estimate (--cost-model roofline), not measured step times; its latencies "
                   "are not validated against a GPU"}]
    summary = _run(tmp_path, SHAREGPT, "--limit", "20", "--qps", "10", "--gpu", "a100-80g", name="a100")
    assert summary["warnings"] == [{
        "code": "no_profile", "value": None, "limit": None,
        "message": "no measured profile for qwen3-0.6b on a100-80g at tensor-parallel size 1 "
                   "(sim/profiles/a100-80g/qwen3-0.6b.json does not exist): step times are the roofline estimate, not "
                   "validated against a GPU"}]
    with pytest.raises(SystemExit) as exc:
        replay_main([str(SHAREGPT), "--cost-model", str(PROFILE.with_name("qwen3-8b.json")), "--out",
                     str(tmp_path / "x"), "--quiet"])
    assert exc.value.code == 2 and not (tmp_path / "x").exists()


def test_other_engine_options_than_the_profile_are_named(tmp_path: Path) -> None:
    summary = _run(tmp_path, SHAREGPT, "--limit", "20", "--qps", "10", "--block-size", "16")
    assert summary["warnings"] == [{
        "code": "profile_engine_options", "value": 16, "limit": 256,
        "message": "block_size is 16 but the profile was measured at 256: its step times are for other batches"}]


def _steps(start_s: list[float], waiting: list[int], replica: int = 0) -> pl.DataFrame:
    return pl.DataFrame({"replica": [replica] * len(start_s), "start_s": start_s, "num_waiting": waiting})


def test_saturation_rule_on_crafted_queues() -> None:
    arrivals = np.linspace(0.0, 30.0, 301)  # 10 req/s for 30 s: the last third is 20-30 s, 101 arrivals
    t = [20.0 + i * 0.1 for i in range(100)]
    growing = saturation_warning(_steps(t, [i // 2 for i in range(100)]), arrivals)  # +5/s: 50 over 10 s
    assert len(growing) == 1 and growing[0]["limit"] == 10.1 and growing[0]["value"] == pytest.approx(50.0, abs=0.5)
    # A queue near saturation that wanders but does not grow, one that grows by less than 10 % of the
    # arrivals, one that drained before the end, and an offline run (all at t=0): none saturated.
    rng = np.random.default_rng(0)
    assert saturation_warning(_steps(t, list(rng.integers(0, 30, 100))), arrivals) == []
    assert saturation_warning(_steps(t, [i // 12 for i in range(100)]), arrivals) == []
    assert saturation_warning(_steps(t, [max(0, 50 - i) for i in range(100)]), arrivals) == []
    assert saturation_warning(_steps([0.0] * 10, list(range(10))), np.zeros(10)) == []


def _skew_steps(steps: list[tuple[int, int, int]]) -> pl.DataFrame:
    """A step log of (prefill tokens, decode rows, longest context) rows, every other row's context 1,000."""
    frame = [(prefill, rows, (rows - 1) * 1000 + longest, longest) for prefill, rows, longest in steps]
    return pl.DataFrame(frame, schema=["num_prefill_tokens", "num_decode_seqs", "decode_context_tokens",
                                       "max_decode_context_tokens"], orient="row")


def test_long_context_skew_in_small_decode_batches_is_named(tmp_path: Path) -> None:
    """One 20,000-token prompt among seven of 500, offline: 39 decode steps of 8 rows whose longest context exceeds
    their mean by ~17,000 tokens, which the H200 profile prices only from 32 rows (its smallest skewed batch)."""
    trace = write_trace(tmp_path / "t.parquet", [20000] + [500] * 7, [40] * 8)
    summary = _run(tmp_path, trace, "--offline")
    assert [w for w in summary["warnings"] if w["code"] == "unpriced_decode_skew"] == [
        {"code": "unpriced_decode_skew",
         "message": "39 of 42 steps (92.9%) decode 4-31 rows whose longest context exceeds their mean by 10,000 "
                    "tokens or more (up to 17,062): the profile prices that excess only from 32 rows; on GPU runs of "
                    "long-context traffic such steps took 5-12 % longer than priced, so TPOT and E2E lean optimistic",
         "value": 17062, "limit": 10000}]  # 20,001 - 23,508 / 8 in the first decode step
    # Three rows (priced long on the GPU runs), or a long context 7,500 above the mean: no warning.
    for name, prompts in (("three", [20000] + [500] * 2), ("shorter", [9000] + [500] * 7)):
        trace = write_trace(tmp_path / f"{name}.parquet", prompts, [40] * len(prompts))
        codes = [w["code"] for w in _run(tmp_path, trace, "--offline", name=name)["warnings"]]
        assert "unpriced_decode_skew" not in codes


def test_skew_rule_on_crafted_steps() -> None:
    profile = json.loads(PROFILE.read_text())
    decode = profile["fit"]["graph_decode"]
    assert decode["skew_min_batch_size"] == 32 and decode["per_excess_context_token_s"] > 0
    quiet = [(0, 40, 1000)] * 196  # 200 steps: 2 skewed ones are 1 %, the least that counts
    # Excesses: 8 rows, longest 14,000: 14,000 - 21,000 / 8 = 11,375; 31 rows, longest 11,334: 10,000.6; 32 rows are
    # priced; a step with a prefill is eager.
    steps = _skew_steps(quiet + [(0, 8, 14_000), (0, 31, 11_334), (0, 32, 30_000), (100, 8, 30_000)])
    (only,) = skew_warning(steps, profile, 256)
    assert (only["value"], only["limit"]) == (11_375, 10_000) and only["message"].startswith(
        "2 of 200 steps (1.0%) decode 4-31 rows whose longest context exceeds their mean by 10,000 tokens or more "
        "(up to 11,375): the profile prices that excess only from 32 rows;")
    # One skewed step of 200 (0.5 %); an excess just short of 10,000 (31 rows, longest 11,333: 9,999.7); 3 rows: none.
    assert skew_warning(_skew_steps(quiet + [(0, 8, 14_000)] + [(0, 40, 1000)] * 3), profile, 256) == []
    assert skew_warning(_skew_steps(quiet + [(0, 8, 14_000), (0, 31, 11_333), (0, 3, 40_000), (0, 40, 1000)]),
                        profile, 256) == []
    # A profile that prices the excess from 4 rows says nothing; one that prices none names every graph batch.
    assert skew_warning(steps, {"fit": {"graph_decode": dict(decode, skew_min_batch_size=4)}}, 256) == []
    (none_priced,) = skew_warning(steps, {"fit": {"graph_decode": dict(decode, per_excess_context_token_s=0.0)}}, 256)
    assert none_priced["message"].startswith("3 of 200 steps (1.5%) decode 4-256 rows") and \
        "the profile prices that excess in no decode batch;" in none_priced["message"]
