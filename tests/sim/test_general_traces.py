"""sim.replay on unusual but valid traces and option combinations: exact results, not only exit 0.

Prompt and output limits at and past their boundaries, thousands of requests at one instant, hours between
arrivals, a single request, prefix reuse (none, stored prompt ids, hash ids, multi-turn sessions), tiny KV caches
that force preemptions, every router on several replicas, reproducible bytes, rescaled arrivals, and summary.json
against requests.parquet; and the saturation warning of a fleet, weighed per replica.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from sim.config import SimConfig
from sim.limits import queued_replicas, saturation_warning
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
from traces.schema import Trace, save_trace
from traces.synth import SynthConfig, synthesize


def _replay(tmp_path: Path, trace: Path, *args: object, name: str = "out") -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    out = tmp_path / name
    assert replay_main([str(trace), "--out", str(out), "--quiet", "--no-report", *map(str, args)]) == 0
    return read_outputs(out)


def _outcomes(requests: pl.DataFrame) -> list[tuple[int, str]]:
    """(output tokens, finish reason) per request, in request id order (ids are the trace's row numbers)."""
    by_id = requests.sort(pl.col("request_id").cast(pl.Int64))
    return list(zip(by_id["output_tokens"].to_list(), by_id["finish_reason"].to_list()))


def _token_trace(prompts: list[list[int]], output_tokens: list[int], arrival_s: list[float]) -> Trace:
    """A trace that stores its prompts' token ids (prefix reuse is then exactly what the ids share)."""
    frame = pl.DataFrame(
        {"request_id": list(range(len(prompts))), "arrival_s": arrival_s, "prompt_tokens": [len(p) for p in prompts],
         "output_tokens": output_tokens, "prompt_token_ids": prompts},
        schema={"request_id": pl.Int64, "arrival_s": pl.Float64, "prompt_tokens": pl.Int64,
                "output_tokens": pl.Int64, "prompt_token_ids": pl.List(pl.Int64)})
    return Trace.from_frame(frame, "token-id test trace")


# --- limits ------------------------------------------------------------------------------------------------------

def test_prompts_past_max_model_len_are_rejected_and_counted_and_long_outputs_cut(tmp_path: Path) -> None:
    prompts = [100, 1024, 1025, 1023, 1024, 5, 1, 3000]
    outputs = [10, 1, 5, 1, 100, 10**6, 1, 1]
    trace = write_trace(tmp_path / "t.parquet", prompts, outputs, [0.1 * i for i in range(8)])
    requests, _, summary = _replay(tmp_path, trace, "--max-model-len", 1024)
    assert requests.height == 8
    # At the limit a prompt still samples its one token: asked for one, that is no cut; asked for more, it is.
    assert _outcomes(requests) == [(10, "length"), (1, "length"), (0, "rejected"), (1, "length"),
                                   (1, "max_model_len"), (1019, "max_model_len"), (1, "length"), (0, "rejected")]
    counts = ("num_requests", "num_finished", "num_rejected", "num_cut")
    assert [summary[key] for key in counts] == [8, 6, 2, 2]
    assert summary["finish_reasons"] == {"length": 4, "max_model_len": 2, "rejected": 2}
    # One reason, the prompts' sizes as a range (each request's own is in requests.parquet's reject_reason)
    assert summary["reject_reasons"] == {"prompt has 1025 to 3000 tokens, more than max_model_len=1024": 2}
    assert sorted(requests["reject_reason"].drop_nulls().to_list()) == [
        "prompt has 1025 tokens, more than max_model_len=1024", "prompt has 3000 tokens, more than max_model_len=1024"]


@pytest.mark.parametrize(("policy", "budget", "expected"), [
    ("mixed", 8192, [(1, "length"), (1, "kv_capacity"), (0, "rejected"), (1, "length"), (1, "kv_capacity"),
                     (207, "kv_capacity"), (100, "length"), (100, "length")]),
    ("nano", 207, [(0, "rejected"), (0, "rejected"), (0, "rejected"), (1, "length"), (1, "token_budget"),
                   (206, "token_budget"), (100, "length"), (100, "length")]),
])
def test_kv_capacity_and_token_budget_boundaries(policy: str, budget: int, expected: list) -> None:
    # 13 blocks of 16 tokens hold 208: a prompt of 208 fits (and samples one token), 209 never does.
    trace = make_trace([208, 208, 209, 207, 207, 1, 100, 100], [1, 5, 1, 1, 3, 500, 100, 100],
                       [0, 1, 2, 3, 4, 5, 6, 6])
    result = simulate(trace, SimConfig(block_size=16, num_gpu_blocks=13, policy=policy,
                                       max_num_batched_tokens=budget))
    requests, _ = result_tables(result)
    assert _outcomes(requests) == expected
    assert_conserved(requests, range(8))


# --- arrivals ----------------------------------------------------------------------------------------------------

def test_thousands_of_requests_at_one_instant() -> None:
    rng = np.random.default_rng(1)
    n = 2000
    outputs = rng.integers(1, 40, n).tolist()
    trace = make_trace(rng.integers(1, 400, n).tolist(), outputs, [5.0] * n)
    result = simulate(trace, SimConfig(num_replicas=2, router="lor"))
    requests, steps = result_tables(result)
    assert_conserved(requests, range(n))
    assert _outcomes(requests) == [(o, "length") for o in outputs]
    assert requests["first_scheduled_s"].min() == 5.0 and steps["start_s"].min() == 5.0
    assert requests.group_by("replica").len().sort("replica")["len"].to_list() == [1000, 1000]
    cfg = result.scheduler_config
    assert_steps_within_limits(steps, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               num_gpu_blocks=cfg.num_gpu_blocks)


@pytest.mark.parametrize("router", ["rr", "lor", "prefix"])
def test_hours_between_arrivals_cost_no_steps(router: str) -> None:
    arrivals = [0.0, 3600.0, 7200.0, 72000.0, 1e6, 1e8]
    result = simulate(make_trace([100] * 6, [50] * 6, arrivals), SimConfig(num_replicas=2, router=router))
    requests, steps = result_tables(result)
    assert steps.height == 6 * 50  # a prefill and 49 decodes per request, nothing in the gaps
    # Each request runs alone on an idle replica: the same latencies, wherever it lies in time.
    # Up to the rounding of times 1e8 s from the start: each of the 50 step ends there is rounded to 2**-26 s (1.5e-8),
    # and the errors add up along a request's steps (1e-8 held for one profile's step times and not for another's).
    for column in ("ttft_s", "e2e_s"):
        assert requests[column].max() - requests[column].min() < 50 * 2**-26, column
    assert (requests["queue_s"] == 0.0).all()


def test_a_single_request(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.parquet", [10], [1], [123.0])
    requests, steps, summary = _replay(tmp_path, trace)
    assert requests.height == 1 and steps.height == 1 and summary["num_steps"] == 1
    assert summary["num_finished"] == 1 and summary["finish_reasons"] == {"length": 1}
    ttft_ms = requests["ttft_s"][0] * 1e3
    # summary.json keeps six significant digits: half a unit of the sixth is 5e-6 of the value.
    close = pytest.approx(ttft_ms, rel=5e-6)
    assert summary["ttft_ms"] == summary["e2e_ms"] == {"p50": close, "p90": close, "p99": close, "mean": close}
    assert summary["duration_s"] == pytest.approx(requests["ttft_s"][0], rel=5e-6)  # from its arrival, not from 0
    assert summary["tpot_ms"]["p50"] is None and summary["itl_ms"]["p50"] is None  # one token has no gaps


def test_decreasing_arrivals_are_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"request_id": pa.array([0, 1, 2], pa.int64()), "arrival_s": [0.0, 2.0, 1.0],
                             "prompt_tokens": pa.array([10] * 3, pa.int64()),
                             "output_tokens": pa.array([5] * 3, pa.int64())}), path)
    with pytest.raises(SystemExit) as exc:
        replay_main([str(path), "--out", str(tmp_path / "out"), "--quiet"])
    assert exc.value.code == 2 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err == (f"error: {path}: row 2 (request_id 2): column 'arrival_s' decreases (1.0 after "
                                       "2.0); arrival times must be non-decreasing\n")


def test_limit_then_qps_rescale_the_replayed_requests(tmp_path: Path) -> None:
    requests, _, summary = _replay(tmp_path, SHAREGPT, "--limit", 50, "--qps", 20)
    assert sorted(requests["request_id"].cast(pl.Int64).to_list()) == list(range(50))
    span_s = requests["arrival_s"].max() - requests["arrival_s"].min()
    assert 49 / span_s == pytest.approx(20.0, rel=1e-12)
    assert (summary["config"]["qps"], summary["config"]["limit"]) == (20.0, 50)


# --- prefix reuse ------------------------------------------------------------------------------------------------

def test_no_shared_prefix_hits_nothing() -> None:
    rng = np.random.default_rng(2)
    trace = make_trace(rng.integers(16, 600, 100).tolist(), [5] * 100, np.arange(100) * 0.05)
    requests, _ = result_tables(simulate(trace, SimConfig(block_size=16)))
    assert requests["cached_tokens"].sum() == 0


@pytest.mark.parametrize("block_size", [16, 256])
def test_a_shared_stored_prefix_hits_in_whole_blocks(block_size: int) -> None:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 150_000, 512).tolist()
    prompts = [prefix + rng.integers(0, 150_000, 100).tolist() for _ in range(10)]
    trace = _token_trace(prompts, [20] * 10, [float(i) for i in range(10)])
    requests, _ = result_tables(simulate(trace, SimConfig(block_size=block_size)))
    assert requests["cached_tokens"].to_list() == [0] + [512] * 9


@pytest.mark.parametrize("prompt_tokens", [1, 16, 17, 33, 256, 257])
@pytest.mark.parametrize("block_size", [16, 256])
def test_a_repeated_prompt_hits_all_but_its_last_token_s_block(prompt_tokens: int, block_size: int) -> None:
    prompt = list(range(100, 100 + prompt_tokens))
    trace = _token_trace([prompt] * 3, [3] * 3, [0.0, 1.0, 2.0])
    requests, _ = result_tables(simulate(trace, SimConfig(block_size=block_size)))
    hit = (prompt_tokens - 1) // block_size * block_size  # at least one prompt token is computed
    assert requests["cached_tokens"].to_list() == [0, hit, hit]


@pytest.mark.parametrize(("block_size", "expected"), [(16, [0, 1024, 0, 1520]), (256, [0, 1024, 0, 1280])])
def test_hash_ids_share_a_prefix_only_from_the_start(block_size: int, expected: list[int]) -> None:
    # 512-token hash blocks: the second request shares two with the first, the third its last two but not its
    # first (no prefix at all), the fourth all three.
    trace = make_trace([1536, 1100, 1536, 1536], [5] * 4, [0.0, 1.0, 2.0, 3.0],
                       hash_ids=[[1, 2, 3], [1, 2, 4], [9, 2, 3], [1, 2, 3]], hash_block_size=512)
    requests, _ = result_tables(simulate(trace, SimConfig(block_size=block_size)))
    assert requests["cached_tokens"].to_list() == expected


def test_a_multi_turn_session_hits_its_earlier_prompts() -> None:
    # Turn k's prompt: turn k-1's prompt, its answer (as the trace has it), a new message of 100 tokens. Only the
    # earlier prompt can be cached (the simulator generates other tokens than the trace's answer).
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, 150_000, 100).tolist()]
    for _ in range(3):
        prompts.append(prompts[-1] + rng.integers(1, 150_000, 150).tolist())
    trace = _token_trace(prompts, [50] * 4, [0.0, 10.0, 20.0, 30.0])
    requests, _ = result_tables(simulate(trace, SimConfig(block_size=16)))
    assert [len(p) for p in prompts] == [100, 250, 400, 550]
    assert requests["cached_tokens"].to_list() == [0, 96, 240, 400]


def test_prefix_router_keeps_sessions_hitting_as_one_replica_does() -> None:
    trace = synthesize(SynthConfig(num_requests=300, qps=5.0, multi_turn=True, turns_dist="fixed:5",
                                   prompt_dist="fixed:300", output_dist="fixed:50", think_time_s=5.0, seed=3))

    def hit_rate(**options) -> float:
        requests, _ = result_tables(simulate(trace, SimConfig(block_size=16, **options)))
        return requests["cached_tokens"].sum() / requests["prompt_tokens"].sum()

    alone, spread = hit_rate(), hit_rate(num_replicas=4, router="rr")
    assert alone > 0.5
    assert spread < alone / 2  # round robin sends a session's turns to other replicas' caches
    assert hit_rate(num_replicas=4, router="prefix") > spread
    assert hit_rate(num_replicas=4, router="prefix", enable_prefix_caching=False) == 0.0


# --- KV pressure ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["mixed", "nano"])
@pytest.mark.parametrize(("replicas", "router"), [(1, "rr"), (3, "lor"), (3, "prefix")])
def test_a_tiny_kv_cache_preempts_and_still_serves_everything(policy: str, replicas: int, router: str) -> None:
    rng = np.random.default_rng(2)
    n = 120
    outputs = rng.integers(1, 300, n).tolist()
    trace = make_trace(rng.integers(1, 200, n).tolist(), outputs, np.sort(rng.uniform(0, 2, n)))
    result = simulate(trace, SimConfig(block_size=16, num_gpu_blocks=40, policy=policy, num_replicas=replicas,
                                       router=router))
    requests, steps = result_tables(result)
    assert_conserved(requests, range(n))
    assert _outcomes(requests) == [(o, "length") for o in outputs]  # 40 blocks hold any one of them whole
    assert requests["num_preemptions"].sum() > 0
    assert steps["num_preempted"].sum() == requests["num_preemptions"].sum()
    cfg = result.scheduler_config
    assert_steps_within_limits(steps, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                               num_gpu_blocks=cfg.num_gpu_blocks)


# --- outputs -----------------------------------------------------------------------------------------------------

def test_summary_agrees_with_requests_parquet(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    n = 150
    prompts = rng.integers(1, 2000, n).tolist()
    trace = write_trace(tmp_path / "t.parquet", prompts, rng.integers(1, 300, n).tolist(),
                        np.sort(rng.uniform(0, 3, n)).tolist())
    requests, steps, summary = _replay(tmp_path, trace, "--block-size", 16, "--num-gpu-blocks", 60,
                                       "--max-model-len", 800)
    served = requests.filter(pl.col("finish_reason") != "rejected")
    assert requests.height == n
    assert summary["num_finished"] + summary["num_rejected"] + summary["num_aborted"] + summary["num_failed"] == n
    assert summary["num_rejected"] == sum(p > 800 for p in prompts) > 0 and summary["num_cut"] > 0
    assert (served["queue_s"] >= 0).all() and (served["ttft_s"] >= served["queue_s"]).all()
    assert (served["first_token_s"] <= served["finish_s"]).all()
    for metric in ("ttft", "tpot", "e2e", "queue"):
        values_ms = served[f"{metric}_s"].drop_nulls().to_numpy() * 1e3
        expected = dict(zip(("p50", "p90", "p99"), np.percentile(values_ms, [50, 90, 99])), mean=values_ms.mean())
        assert summary[f"{metric}_ms"] == {k: pytest.approx(v, rel=1e-5) for k, v in expected.items()}, metric
    assert summary["num_preemptions"] == requests["num_preemptions"].sum() == steps["num_preempted"].sum() > 0
    assert summary["num_steps"] == steps.height
    assert summary["total_output_tokens"] == served["output_tokens"].sum()


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    args = ("--limit", 100, "--replicas", 2, "--router", "lor", "--host-slowdown", "episodes:1,2,0.3,0.5")
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        _replay(tmp_path, SHAREGPT, *args, "--seed", seed, name=name)

    def table_bytes(name: str, table: str) -> bytes:
        return (tmp_path / name / table).read_bytes()

    for table in ("requests.parquet", "steps.parquet"):
        assert table_bytes("a", table) == table_bytes("b", table)
    assert table_bytes("a", "steps.parquet") != table_bytes("c", "steps.parquet")  # the slow episodes move


def test_roofline_bands_bracket_their_median(tmp_path: Path) -> None:
    _, _, summary = _replay(tmp_path, SHAREGPT, "--limit", 40, "--cost-model", "roofline", "--bands", 2)
    assert [w["code"] for w in summary["warnings"]] == ["no_profile"]
    bands = summary["bands"]["metrics"]
    assert set(bands) >= {"ttft_ms", "tpot_ms", "e2e_ms", "duration_s"}
    for stat in ("p50", "p90", "p99", "mean"):
        band = bands["ttft_ms"][stat]
        assert band["p5"] <= band["median"] <= band["p95"]


# --- saturation of a fleet ---------------------------------------------------------------------------------------

def _fleet_saturation(num_requests: int, replicas: int, qps: float) -> list[dict]:
    trace = make_trace([200] * num_requests, [300] * num_requests, [i / qps for i in range(num_requests)])
    result = simulate(trace, SimConfig(num_replicas=replicas, max_num_seqs=32))
    requests = result.requests_table()
    return saturation_warning(pl.from_arrow(result.steps_table()), requests.column("arrival_s").to_numpy(),
                              queued_replicas(requests))


def test_a_fleet_is_past_saturation_as_each_of_its_replicas_is() -> None:
    # Four replicas at four times the load of one: each queue grows as the one replica's does, and each is
    # weighed against the requests it was given (against all of the fleet's, no fleet of ten ever warned).
    # (A replica of the four gets every fourth request, its arrivals a 1/240 s shift of the one replica's: the last
    # third of the arrivals may hold one request fewer, and the trend moves by as little.)
    one = _fleet_saturation(200, 1, 60.0)
    four = _fleet_saturation(800, 4, 240.0)
    assert [(w["value"], w["limit"]) for w in one] == [(12.8, 6.7)]
    assert len(four) == 1 and four[0]["value"] == pytest.approx(12.8, abs=0.2)
    assert four[0]["limit"] in (6.6, 6.7)
    assert "of the 67 that arrived then" in one[0]["message"]
    assert re.search(r"of the 6[67] that were queued on it then", four[0]["message"])


def test_saturation_of_crafted_queues_on_ten_replicas() -> None:
    arrivals = np.linspace(0.0, 30.0, 301)  # 10 req/s for 30 s: 101 in the last third, about 10 per replica
    replicas = np.arange(301) % 10
    t = [20.0 + i * 0.1 for i in range(100)]
    steps = pl.DataFrame({"replica": [3] * 100, "start_s": t, "num_waiting": [i // 12 for i in range(100)]})
    warning = saturation_warning(steps, arrivals, replicas)  # +8 over 10 s: most of its 10 arrivals
    assert len(warning) == 1 and warning[0]["limit"] == 5 and warning[0]["value"] == pytest.approx(8.3, abs=0.1)
    assert saturation_warning(steps, arrivals) == []  # one replica taking all 101 would not be saturated by +8


def test_rejected_requests_are_not_counted_as_queued() -> None:
    n = 200
    # Every other request can never fit: 200 are queued, at 60 req/s, as in the single replica above.
    trace = make_trace([200, 5000] * n, [300, 1] * n, [i // 2 / 60 for i in range(2 * n)])
    result = simulate(trace, SimConfig(max_num_seqs=32, max_model_len=4096))
    requests = result.requests_table()
    warning = saturation_warning(pl.from_arrow(result.steps_table()), requests.column("arrival_s").to_numpy(),
                                 queued_replicas(requests))
    assert [(w["value"], w["limit"]) for w in warning] == [(12.8, 6.7)]


def test_the_cli_warns_of_a_saturated_fleet(tmp_path: Path) -> None:
    n = 800
    trace = write_trace(tmp_path / "t.parquet", [200] * n, [300] * n, [i / 240 for i in range(n)])
    _, _, summary = _replay(tmp_path, trace, "--replicas", 4, "--max-num-seqs", 32)
    saturated = [w for w in summary["warnings"] if w["code"] == "past_saturation"]
    assert [w["limit"] for w in saturated] == [6.6]  # 10 % of the 66 queued on replica 0 in the last third


def test_outputs_name_every_request_of_a_string_id_trace(tmp_path: Path) -> None:
    frame = pl.DataFrame({"request_id": ["b", "a", "c", "é x"], "arrival_s": [0.0, 0.0, 1.0, 1.0],
                          "prompt_tokens": [10, 20, 30, 40], "output_tokens": [5, 5, 5, 5],
                          "session_id": [None, "s", None, "s"]})
    path = tmp_path / "t.parquet"
    save_trace(frame, path)
    requests, _, summary = _replay(tmp_path, path, "--replicas", 2, "--router", "prefix")
    assert sorted(requests["request_id"].to_list()) == ["a", "b", "c", "é x"]
    assert requests["output_tokens"].to_list() == [5, 5, 5, 5] and summary["num_finished"] == 4
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["num_requests"] == 4
