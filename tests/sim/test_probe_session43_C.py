"""Session 43 (helper C): an independent check of what a simulated replay's summary.json, CLI table and report claim,
recomputed here from its requests.parquet and steps.parquet alone, on valid inputs of many kinds (both policies,
tiny KV caches that preempt, block size 16, no prefix caching, the roofline cost model, host slowdowns, fleets
behind each router, offline, --qps/--time-scale/--limit, synthetic traces, arrivals at one instant, a single request,
prompts at --max-model-len), plus hypothesis-drawn small traces and configurations.

Nothing here calls analysis.metrics: the definitions are written out from their documentation (vLLM's
calculate_metrics as analysis/README.md states it) so that a drift in the product shows as a failure:
- latencies over finished requests ("stop", "length" and the cuts); TTFT = first token - arrival, E2E = finish -
  arrival, queue = first scheduled - arrival, TPOT = (E2E - TTFT) / (output tokens - 1) over outputs of two or more
  tokens, ITL = every gap between a finished request's consecutive tokens, pooled;
- percentiles by linear interpolation between closest ranks (numpy's default: index (n - 1) q / 100), means
  arithmetic, vLLM's std the population one;
- throughputs = finished requests (and their tokens) over the makespan, the first arrival to the last token;
- prefix-cache hit rate token-weighted: cached prompt tokens over prompt tokens of the admitted (not rejected)
  requests, as engine.replay's summary (the same request table) reports it.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.band_stats import flat_bands
from analysis.compare.cli import main as compare_main
from analysis.summarize import main as summarize_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT, write_trace
from traces.synth import main as synth_main

FINISHED = ("stop", "length", "max_model_len", "kv_capacity", "token_budget")
CUT = ("max_model_len", "kv_capacity", "token_budget")
# summary.json rounds to six significant digits: half a unit of the sixth digit, relative.
ROUNDED = 5.000001e-6


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks, the textbook definition of numpy's default."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def _stats_ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(("p50", "p90", "p99", "mean", "median", "std"))
    ms = [v * 1e3 for v in values]
    mean = sum(ms) / len(ms)
    return {"p50": _percentile(ms, 50), "p90": _percentile(ms, 90), "p99": _percentile(ms, 99), "mean": mean,
            "median": _percentile(ms, 50), "std": math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms))}


def _expected_summary(rows: list[dict], prefix_caching: bool) -> dict:
    """The summary's figures, from the request rows alone and whether the run had a prefix cache."""
    finished = [r for r in rows if r["finish_reason"] in FINISHED]
    admitted = [r for r in rows if r["finish_reason"] != "rejected"]
    ends = [r["finish_s"] for r in rows if r["finish_s"] is not None]
    ends += [t for r in rows for t in r["token_times_s"] or []]
    duration_s = max(ends) - min(r["arrival_s"] for r in rows)
    latencies = {
        "ttft": [r["first_token_s"] - r["arrival_s"] for r in finished],
        "e2e": [r["finish_s"] - r["arrival_s"] for r in finished],
        "queue": [r["first_scheduled_s"] - r["arrival_s"] for r in finished],
        "tpot": [(r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
                 for r in finished if r["output_tokens"] > 1],
        "itl": [b - a for r in finished for a, b in zip(r["token_times_s"], r["token_times_s"][1:])],
    }
    finished_output = sum(r["output_tokens"] for r in finished)
    finished_prompt = sum(r["prompt_tokens"] for r in finished)
    prompt_tokens = sum(r["prompt_tokens"] for r in admitted)
    cached_tokens = sum(r["cached_tokens"] for r in admitted)
    expected = {
        "num_requests": len(rows), "num_finished": len(finished),
        "num_rejected": sum(r["finish_reason"] == "rejected" for r in rows),
        "num_cut": sum(r["finish_reason"] in CUT for r in rows),
        "total_prompt_tokens": prompt_tokens, "total_output_tokens": sum(r["output_tokens"] for r in admitted),
        "total_cached_tokens": cached_tokens, "num_preemptions": sum(r["num_preemptions"] for r in rows),
        # no rate of a cache that is not there, as vLLM reports none (a 0.0 read as a cache that missed)
        "prefix_cache_hit_rate": cached_tokens / prompt_tokens if prompt_tokens and prefix_caching else None,
        "duration_s": duration_s, "duration": duration_s,
        # every request rejected at one instant: no span to divide by, and no rate (null, never a measured 0)
        "request_throughput": len(finished) / duration_s if duration_s else None,
        "output_throughput": finished_output / duration_s if duration_s else None,
        "total_token_throughput": (finished_output + finished_prompt) / duration_s if duration_s else None,
        "completed": len(finished), "failed": len(rows) - len(finished), "total_input_tokens": finished_prompt,
    }
    for metric, values in latencies.items():
        stats = _stats_ms(values)
        expected[f"{metric}_ms"] = {name: stats[name] for name in ("p50", "p90", "p99", "mean")}
        vllm_metric = "e2el" if metric == "e2e" else metric
        if metric != "queue":
            expected.update({f"{name}_{vllm_metric}_ms": stats[name] for name in ("mean", "median", "std", "p99")})
    return expected


def _assert_matches(summary: dict, expected: dict) -> None:
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_matches(summary[key], value)
        elif isinstance(value, float):
            assert summary[key] == pytest.approx(value, rel=ROUNDED, abs=1e-9), key
        else:
            assert summary[key] == value, key


def _assert_requests_consistent(rows: list[dict], requested: dict[str, int]) -> None:
    """Per request: times in order, one token time per output token, outputs as asked unless cut."""
    for r in rows:
        what = f"request {r['request_id']}"
        if r["finish_reason"] == "rejected":
            assert r["output_tokens"] == 0 and r["first_token_s"] is None, what
            continue
        times = r["token_times_s"]
        assert len(times) == r["output_tokens"] >= 1, what
        assert times == sorted(times), what
        assert r["arrival_s"] <= r["first_scheduled_s"] <= r["first_token_s"] == times[0] <= r["finish_s"], what
        assert r["finish_s"] == times[-1], what
        assert 0 <= r["cached_tokens"] < r["prompt_tokens"], what  # at least one prompt token is always computed
        if r["finish_reason"] == "length":
            assert r["output_tokens"] == requested[r["request_id"]], what
        else:  # the simulator never stops early: only an engine limit ends a request before its length
            assert r["finish_reason"] in CUT and r["output_tokens"] < requested[r["request_id"]], what


def _assert_steps_consistent(rows: list[dict], steps: pl.DataFrame, num_gpu_blocks: int) -> None:
    """Per replica: steps back to back in time, KV within the cache, and every count of a step row what the requests
    say of it (tokens sampled at its end, finishes, the sequences still queued or running after it)."""
    assert (steps["num_batched_tokens"] == steps["num_prefill_tokens"] + steps["num_decode_seqs"]).all()
    assert (steps["num_seqs"] == steps["num_prefill_seqs"] + steps["num_decode_seqs"]).all()
    assert (steps["num_kv_blocks_used"] <= num_gpu_blocks).all()
    assert steps["kv_usage"].to_list() == pytest.approx((steps["num_kv_blocks_used"] / num_gpu_blocks).to_list())
    assert steps["num_preempted"].sum() == sum(r["num_preemptions"] for r in rows)
    for (replica,), group in steps.sort("replica", "step").group_by("replica", maintain_order=True):
        served = [r for r in rows if r["replica"] == replica and r["finish_reason"] != "rejected"]
        starts_s = group["start_s"].to_numpy()
        ends_s = starts_s + group["duration_s"].to_numpy()
        assert group["step"].to_list() == list(range(group.height))
        assert (group["duration_s"] > 0).all() and (starts_s[1:] >= ends_s[:-1]).all()
        assert {r["first_scheduled_s"] for r in served} <= set(starts_s.tolist())
        token_times = np.array([t for r in served for t in r["token_times_s"]])
        assert set(token_times.tolist()) <= set(ends_s.tolist())  # tokens come at the end of a step
        sampled = np.bincount(np.searchsorted(ends_s, token_times), minlength=len(ends_s))
        decodes, prefills = group["num_decode_seqs"].to_numpy(), group["num_prefill_seqs"].to_numpy()
        assert ((decodes <= sampled) & (sampled <= decodes + prefills)).all()  # a prefill's last chunk samples one
        finishes = np.bincount(np.searchsorted(ends_s, [r["finish_s"] for r in served]), minlength=len(ends_s))
        assert group["num_finished"].to_list() == finishes.tolist()
        arrivals_s = np.array([r["arrival_s"] for r in served])
        finishes_s = np.array([r["finish_s"] for r in served])
        live = [int(((arrivals_s <= end_s) & (finishes_s > end_s)).sum()) for end_s in ends_s]
        assert (group["num_running"] + group["num_waiting"]).to_list() == live


def _replay(tmp_path: Path, trace: Path, *options: object, report: bool = False) -> Path:
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    argv = [str(trace), "--out", str(out), "--quiet", *map(str, options)]
    assert replay_main(argv if report else [*argv, "--no-report"]) == 0
    return out


def _check_run(out: Path, trace: Path) -> tuple[list[dict], pl.DataFrame, dict]:
    """Every check above on one run folder; returns its rows, steps and summary."""
    rows = pl.read_parquet(out / "requests.parquet").to_dicts()
    steps = pl.read_parquet(out / "steps.parquet")
    summary = json.loads((out / "summary.json").read_text())
    requested = pl.read_parquet(trace).select(pl.col("request_id").cast(pl.String), "output_tokens").rows()
    _assert_requests_consistent(rows, dict(requested))
    _assert_steps_consistent(rows, steps, summary["config"]["num_gpu_blocks"])
    _assert_matches(summary, _expected_summary(rows, summary["config"]["enable_prefix_caching"]))
    assert summary["num_steps"] == steps.height
    if steps.height == 0:  # every request rejected: no KV usage at all, not a measured 0
        assert summary["peak_kv_usage"] is None and summary["mean_kv_usage"] is None
    else:
        assert summary["peak_kv_usage"] == pytest.approx(steps["kv_usage"].max(), rel=ROUNDED)
        weights = steps["duration_s"].to_numpy()  # usage weighted by the time each step held it
        mean_kv_usage = float((steps["kv_usage"].to_numpy() * weights).sum() / weights.sum())
        assert summary["mean_kv_usage"] == pytest.approx(mean_kv_usage, rel=ROUNDED)
    return rows, steps, summary


def _hand_made(tmp_path: Path, name: str, **columns) -> Path:
    return write_trace(tmp_path / f"{name}.parquet", **columns)


@pytest.fixture(scope="module")
def multi_turn_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("synth") / "sessions.parquet"
    assert synth_main(["-o", str(path), "--num-requests", "150", "--qps", "20", "--multi-turn", "--think-time-s",
                       "2", "--seed", "4"]) == 0
    return path


SHAREGPT_CASES = {
    "mixed": ["--qps", 40, "--limit", 150],
    "nano": ["--qps", 40, "--limit", 150, "--policy", "nano"],
    "tiny cache, block 16": ["--qps", 80, "--limit", 150, "--num-gpu-blocks", 60, "--block-size", 16],
    "tiny cache, nano": ["--qps", 60, "--limit", 120, "--num-gpu-blocks", 40, "--policy", "nano"],
    "max-model-len cuts": ["--time-scale", 0.05, "--limit", 120, "--block-size", 16, "--max-model-len", 600],
    "no prefix caching, roofline": ["--limit", 80, "--no-prefix-caching", "--cost-model", "roofline"],
    "host slowdown episodes": ["--limit", 80, "--host-slowdown", "episodes:1.0,2.0,0.3,0.5"],
    "offline, 2 rr": ["--offline", "--limit", 120, "--replicas", 2, "--router", "rr"],
    "3 lor": ["--qps", 100, "--limit", 150, "--replicas", 3, "--router", "lor"],
    "4 prefix, sampling": ["--qps", 100, "--limit", 150, "--replicas", 4, "--router", "prefix", "--temperature", 1],
}


@pytest.mark.parametrize("case", SHAREGPT_CASES)
def test_sharegpt_summary_recomputes_from_its_tables(tmp_path, case):
    _check_run(_replay(tmp_path, SHAREGPT, *SHAREGPT_CASES[case]), SHAREGPT)


@pytest.mark.parametrize("options", [[], ["--replicas", 2, "--router", "prefix", "--block-size", 16,
                                          "--num-gpu-blocks", 80, "--policy", "nano"]])
def test_synthetic_sessions_summary_recomputes_from_its_tables(tmp_path, multi_turn_trace, options):
    _, _, summary = _check_run(_replay(tmp_path, multi_turn_trace, *options), multi_turn_trace)
    assert summary["prefix_cache_hit_rate"] > 0  # later turns resend earlier ones: the cache is exercised


def test_one_instant_one_request_and_prompts_at_max_model_len(tmp_path):
    at_once = _hand_made(tmp_path, "at_once", prompt_tokens=[300 + i for i in range(12)],
                         output_tokens=[20 + i for i in range(12)], arrival_s=[1.0] * 12)
    for options in ([], ["--replicas", 3, "--router", "lor", "--num-gpu-blocks", 30, "--block-size", 16]):
        rows, _, _ = _check_run(_replay(tmp_path, at_once, *options), at_once)
        for replica in {r["replica"] for r in rows}:  # one instant: served in trace order on each replica
            ordered = sorted((int(r["request_id"]), r["first_scheduled_s"]) for r in rows if r["replica"] == replica)
            assert [t for _, t in ordered] == sorted(t for _, t in ordered)
    single = _hand_made(tmp_path, "single", prompt_tokens=[1000], output_tokens=[40], arrival_s=[3.0])
    _, _, summary = _check_run(_replay(tmp_path, single, "--replicas", 2), single)
    assert summary["num_finished"] == 1 and summary["ttft_ms"]["p50"] == summary["ttft_ms"]["p99"]
    # prompts one below, at and one above --max-model-len 2064, and one that fits with room to spare
    edge = _hand_made(tmp_path, "edge", prompt_tokens=[2063, 2064, 2065, 2000], output_tokens=[5, 5, 5, 64],
                      arrival_s=[0.0, 0.0, 0.1, 0.2])
    rows, _, summary = _check_run(_replay(tmp_path, edge, "--max-model-len", 2064, "--block-size", 16), edge)
    assert [(r["output_tokens"], r["finish_reason"]) for r in rows] == [
        (1, "max_model_len"), (1, "max_model_len"), (0, "rejected"), (64, "length")]
    assert summary["num_cut"] == 2 and summary["num_rejected"] == 1


def test_least_outstanding_router_chose_the_least_loaded_replica_at_each_arrival(tmp_path):
    """Rebuilt from the outputs: at its arrival, each request went to the replica with the fewest requests routed
    to it that had not finished yet (the lowest index among equals), though replicas fast-forward between arrivals."""
    out = _replay(tmp_path, SHAREGPT, *SHAREGPT_CASES["3 lor"])
    rows = pl.read_parquet(out / "requests.parquet").sort(pl.col("request_id").cast(pl.Int64)).to_dicts()
    for k, request in enumerate(rows):
        loads = [0, 0, 0]
        for earlier in rows[:k]:
            if earlier["finish_s"] > request["arrival_s"]:
                loads[earlier["replica"]] += 1
        assert request["replica"] == loads.index(min(loads)), request["request_id"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(st.tuples(st.sampled_from([0.0, 0.0, 0.001, 0.05, 0.5]), st.integers(1, 700),
                                st.integers(1, 120)), min_size=1, max_size=25),
    options=st.tuples(
        st.sampled_from([["--policy", "mixed"], ["--policy", "nano"]]),
        st.sampled_from([["--num-gpu-blocks", 12], ["--num-gpu-blocks", 40], []]),
        st.sampled_from([[], ["--max-model-len", 300], ["--max-num-batched-tokens", 256]]),
        st.sampled_from([[], ["--replicas", 2, "--router", "lor"], ["--replicas", 3, "--router", "prefix"],
                         ["--replicas", 2, "--router", "rr"]]),
        st.sampled_from([[], ["--no-prefix-caching"], ["--offline"]]),
    ),
)
def test_drawn_traces_summary_recomputes_from_its_tables(tmp_path, requests, options):
    gaps_s, prompts, outputs = zip(*requests)
    trace = _hand_made(tmp_path, "drawn", prompt_tokens=prompts, output_tokens=outputs,
                       arrival_s=np.cumsum(gaps_s).tolist())
    _check_run(_replay(tmp_path, trace, "--block-size", 16, *[o for group in options for o in group]), trace)


def test_a_run_compared_with_itself_has_no_error_and_judges_its_bands(tmp_path, capsys):
    """Every figure equal, every error 0, and "inside" exactly where the figure lies in the band summary.json gives.
    (Not inside everywhere: the unperturbed replay is one more draw beside three band replays, the band's extremes,
    and those vary the step times around the model and each machine's mean host speed among the calibrated
    sessions', whose median is not their mean the unperturbed replay uses.)"""
    real = _replay(tmp_path, SHAREGPT, "--qps", 40, "--limit", 100, "--bands", 3)
    sim = tmp_path / "copy"
    shutil.copytree(real, sim)
    assert compare_main([str(real), str(sim), "--out", str(tmp_path / "cmp"), "--no-report", "--schedule"]) == 0
    capsys.readouterr()
    compared = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert compared["schedule"]["identical"] is True
    summary = json.loads((real / "summary.json").read_text())
    for row in compared["metrics"]:
        assert row["sim"] == row["real"] and row["diff"] == 0, row["key"]
        assert row["rel_error"] == (None if row["real"] == 0 else 0.0), row["key"]
        stat = summary
        for part in row["key"].split("."):
            stat = stat.get(part) if isinstance(stat, dict) else None
        assert stat is None or stat == row["real"], row["key"]  # the figures summary.json holds
        band = flat_bands(summary).get(row["key"])
        assert row.get("in_band") == (None if band is None else band["p5"] <= row["real"] <= band["p95"]), row["key"]
    assert sum("in_band" in row for row in compared["metrics"]) == 21
    errors = compared["requests"]["relative_errors"]
    assert {key: (entry["mean_abs"], entry["num_pairs"]) for key, entry in errors.items()} == {
        "ttft": (0.0, 100), "tpot": (0.0, 100), "e2e": (0.0, 100)}


def _report_cells(path: Path) -> list[str]:
    text = path.read_text()
    tables = text[text.index("<table"):text.index("</table>", text.index("latency (ms)"))]
    return [html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tables)]


def test_report_cli_table_and_summarize_show_summary_json(tmp_path, capsys):
    out = tmp_path / "run"
    options = ["--qps", 80, "--limit", 150, "--num-gpu-blocks", 60, "--block-size", 16, "--replicas", 2,
               "--router", "lor"]
    assert replay_main([str(SHAREGPT), "--out", str(out), *map(str, options)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    cells = _report_cells(out / "report.html")
    figures = dict(zip(cells[0:34:2], cells[1:34:2]))
    assert figures["requests"] == str(summary["num_requests"])
    assert figures["finished"] == str(summary["num_finished"])
    # the count, then the reasons (grouped: one line for prompts of 61 to 495 blocks)
    assert figures["rejected"] == "{} ({})".format(
        summary["num_rejected"], "; ".join(f"{reason}: {count}" for reason, count in summary["reject_reasons"].items()))
    assert figures["duration"] == f"{summary['duration_s']:.2f} s"
    assert figures["request throughput"] == f"{summary['request_throughput']:.3f} req/s"
    assert figures["output throughput"] == f"{summary['output_throughput']:.1f} tok/s"
    assert figures["preemptions"] == str(summary["num_preemptions"])
    assert figures["prefix cache hit rate"] == f"{summary['prefix_cache_hit_rate']:.1%}".replace("%", " %")
    latency_rows = cells[cells.index("TTFT"):]
    for label, key in zip(("TTFT", "TPOT", "ITL", "E2E", "queue"), ("ttft", "tpot", "itl", "e2e", "queue")):
        at = latency_rows.index(label)
        shown = [f"{summary[f'{key}_ms'][stat]:.2f}" for stat in ("p50", "p90", "p99", "mean")]
        assert latency_rows[at + 1:at + 5] == shown, label
        assert re.search(rf"^  {label} +{' +'.join(map(re.escape, shown))}$", printed, re.M), label
    assert f"requests finished       {summary['num_finished']} / {summary['num_requests']}" in printed
    # analysis.summarize recomputes summary.json from the tables (keeping only its meta: config, trace, warnings)
    again = tmp_path / "again"
    shutil.copytree(out, again)
    assert summarize_main([str(again), "--quiet"]) == 0
    assert json.loads((again / "summary.json").read_text()) == summary
