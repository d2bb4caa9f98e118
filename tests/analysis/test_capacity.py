"""The capacity CLI end to end on a small slice, and its exit code 2 for bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import main
from analysis.capacity.report import CHART_TITLES

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "traces" / "sharegpt.parquet")
# An 8B model on L40S saturates at a few requests/s, so every configuration bisects to a real limit
# (the roofline cost model is pinned so a measured profile added later cannot change that).
SMALL_SWEEP = [
    TRACE, "--limit", "200", "--model", "qwen3-8b", "--gpu", "l40s", "--replicas", "1,2", "--cost-model", "roofline",
    "--slo", "ttft_p90=500ms,tpot_p90=50ms", "--tolerance", "0.2", "--max-iterations", "6",
    "--target-qps", "20", "--gpu-cost", "l40s=1.25", "--quiet",
    # Streams of 60 s or 150 requests: enough to exercise every part, too short for a real answer.
    "--min-duration-s", "60", "--min-requests", "150", "--seeds", "2",
]
CONFIG_KEYS = {
    "config_id", "label", "options", "max_qps", "max_qps_kind", "max_qps_by_seed", "max_qps_spread", "max_qps_band",
    "converged",
    "monotone", "notes", "num_simulations", "cost_model", "slos_ms", "cost", "pareto", "replicas_needed", "searches",
}
SEARCH_KEYS = {"seed", "max_qps", "kind", "converged", "monotone", "notes", "points", "duration_checks"}
POINT_KEYS = {
    "qps", "seed", "duration_scale", "feasible", "meets_slos", "stable", "stopped_early", "goodput_rps",
    "slo_values_ms", "num_requests", "num_finished", "num_rejected", "stream_requests", "stream_duration_s",
    "warmup_s", "request_throughput_rps", "output_throughput_tok_s", "total_output_tokens", "prefix_cache_hit_rate",
    "num_preemptions", "stability", "latency_ms",
}


@pytest.fixture(scope="module")
def sweep_dirs(tmp_path_factory) -> dict[int, Path]:
    """The same small sweep run with 2 processes and serially."""
    dirs = {}
    for jobs in (2, 1):
        out = tmp_path_factory.mktemp(f"capacity-jobs{jobs}")
        assert main(SMALL_SWEEP + ["--jobs", str(jobs), "--out", str(out)]) == 0
        dirs[jobs] = out
    return dirs


def test_writes_the_three_outputs_with_the_documented_keys(sweep_dirs: dict[int, Path]) -> None:
    out = sweep_dirs[2]
    records = json.loads((out / "capacity.json").read_text())
    assert isinstance(records, list) and len(records) == 2
    for record in records:
        assert set(record) == CONFIG_KEYS
        assert record["options"]["model"] == "qwen3-8b" and record["options"]["gpu"] == "l40s"
        assert record["slos_ms"] == {"ttft_p90": 500.0, "tpot_p90": 50.0}
        searches = record["searches"]
        assert [s["seed"] for s in searches] == [0, 1] and all(set(s) == SEARCH_KEYS for s in searches)
        assert record["num_simulations"] == sum(len(s["points"]) + len(s["duration_checks"]) for s in searches) >= 6
        for search in searches:
            assert all(set(point) == {"iteration"} | POINT_KEYS for point in search["points"])
            assert [p["iteration"] for p in search["points"]] == list(range(len(search["points"])))
            checks = search["duration_checks"]
            revised = {c["qps"] for c in checks[:-1]}  # failed twice as long: counted as failed
            passing = [p["qps"] for p in search["points"] if p["feasible"] and p["qps"] not in revised]
            assert search["max_qps"] == max(q for q in passing if q <= search["max_qps"])
            assert checks[-1]["qps"] == search["max_qps"]
            assert all(set(c) == POINT_KEYS and c["duration_scale"] == 2.0 for c in checks)
            assert all(p["feasible"] == (p["meets_slos"] and p["stable"]) for p in search["points"])
        by_seed = sorted(s["max_qps"] for s in searches)
        assert record["max_qps"] == by_seed[0]  # the lower median of two seeds
        assert record["max_qps_spread"] == {"min": by_seed[0], "max": by_seed[1]}
        assert record["max_qps_kind"] in ("converged", "not_confirmed", "bracket")
        assert record["monotone"]
        assert record["cost"]["usd_per_gpu_hour"] == 1.25
        assert record["pareto"]["latency_key"] == "ttft_p90"
        assert record["replicas_needed"]["target_qps"] == 20.0
    assert [r["options"]["num_replicas"] for r in records] == [1, 2]
    assert records[1]["max_qps"] >= records[0]["max_qps"]  # streams this short are noisy: not strictly more

    frame = pl.read_parquet(out / "capacity.parquet")
    assert frame.height == sum(r["num_simulations"] for r in records)
    for column in ("config_id", "num_replicas", "qps", "seed", "duration_scale", "feasible", "meets_slos", "stable",
                   "stability_completion_ratio", "stability_backlog_growth_fraction", "goodput_rps", "max_qps",
                   "max_qps_kind", "is_max_qps", "slo_ttft_p90_ms", "slo_tpot_p90_ms", "ttft_p90_ms", "tpot_p90_ms",
                   "ttft_p99_ms",
                   "cost_per_million_output_tokens_usd"):
        assert column in frame.columns
    assert frame.filter(pl.col("is_max_qps")).height == 4  # one per (configuration, seed)

    page = (out / "report.html").read_text()
    for title in ("Latency versus offered load", CHART_TITLES["max_qps"], CHART_TITLES["replicas"],
                  CHART_TITLES["cost"], CHART_TITLES["pareto"]):
        assert title in page
    assert 'data-gpu="l40s" value="1.25"' in page  # the editable price table
    assert "<script src=" not in page  # offline: plotly.js is inlined


def test_results_do_not_depend_on_jobs(sweep_dirs: dict[int, Path]) -> None:
    assert (sweep_dirs[2] / "capacity.json").read_text() == (sweep_dirs[1] / "capacity.json").read_text()
    parallel = pl.read_parquet(sweep_dirs[2] / "capacity.parquet")
    serial = pl.read_parquet(sweep_dirs[1] / "capacity.parquet")
    assert parallel.equals(serial)


def test_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in SMALL_SWEEP if a != "--quiet"]
    argv[argv.index("--replicas") + 1] = "2"  # an option is given once (a second one is refused)
    argv += ["--jobs", "1", "--out", str(tmp_path)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "configuration" in printed and "max QPS" in printed and "$/1M tok" in printed and "done/arr" in printed
    assert "replicas needed for 20 req/s:" in printed
    assert f"outputs in {tmp_path}/" in printed


def test_help() -> None:
    result = subprocess.run([sys.executable, "-m", "analysis.capacity", "--help"], cwd=REPO, capture_output=True,
                            text=True, check=True)
    for option in ("--slo", "--replicas", "--router", "--qps-min", "--tolerance", "--target-qps", "--gpu-cost",
                   "--jobs", "--ray", "--candidates-per-round", "--min-duration-s", "--min-requests",
                   "--warmup-fraction", "--think-times", "--stability-tolerance", "--seeds", "--bands",
                   "--no-early-stop", "--no-duration-check"):
        assert option in result.stdout


BAD_INPUTS = [
    (["--slo", "ttft_p90=2"], "argument --slo: SLO 'ttft_p90=2' needs a unit"),
    (["--slo", "ttft_p90=2s", "--replicas", ""], "argument --replicas: empty list"),
    (["--slo", "ttft_p90=2s", "--replicas", "1,0"], "argument --replicas: 0 must be >= 1"),
    # Accepted: its seeds made capacity.parquet's seed column Int128, which pyarrow cannot read.
    (["--slo", "ttft_p90=2s", "--seed-offset", str(2**63 - 999)],
     f"argument --seed-offset: {2**63 - 999} must be at most 2**63 - 1000"),
    (["--slo", "ttft_p90=2s", "--replicas", f"1,{2**70}"], "error: --replicas: num_replicas must be at most 10,000"),
    (["--slo", "ttft_p90=2s", "--max-num-seqs", "8,x"], "argument --max-num-seqs: 'x' is not an integer"),
    (["--slo", "ttft_p90=2s", "--model", "nope"], "argument --model: model 'nope' is neither"),
    (["--slo", "ttft_p90=2s", "--gpu", "h200,h900"], "argument --gpu: unknown GPU 'h900'; supported: h200"),
    (["--slo", "ttft_p90=2s", "--policy", "fifo"], "argument --policy: unknown policy 'fifo'; supported: mixed, nano"),
    (["--slo", "ttft_p90=2s", "--router", "random"], "argument --router: unknown router 'random'; supported: rr, lor"),
    (["--slo", "ttft_p90=2s", "--router", "rr,rr"], "argument --router: rr given twice"),
    ([], "the following arguments are required: --slo"),
    (["--slo", "ttft_p90=2s", "--gpu-cost", "h200=abc"], "error: --gpu-cost: price of 'h200'"),  # was said twice
    (["--slo", "ttft_p90=2s", "--gpu", "l40s", "--gpu-cost", "/no/such/prices.json"], "--gpu-cost: "),
    (["--slo", "ttft_p90=2s", "--tolerance", "0"], "--tolerance must be in"),
    (["--slo", "ttft_p90=2s", "--qps-min", "5", "--qps-max", "2"], r"--qps-min (5.0) must be below --qps-max (2.0)"),
    (["--slo", "ttft_p90=2s", "--limit", "1"], "--limit must be >= 2"),
    (["--slo", "ttft_p90=2s", "--jobs", "0"], "argument --jobs: 0 must be >= 1"),
    (["--slo", "ttft_p90=2s", "--out", ""], "argument --out: is empty"),  # swept, then wrote under runs/
    (["--slo", "ttft_p90=2s", "--ray", ""], "argument --ray: is empty; expected auto"),  # ran locally instead
    # Without --ray the timeout was never read: the sweep ran locally at exit 0.
    (["--slo", "ttft_p90=2s", "--ray-connect-timeout-s", "5"],
     "error: --ray-connect-timeout-s 5 is how long to wait for a Ray cluster, and no --ray ADDRESS is given"),
    (["--slo", "ttft_p90=2s", "--gpu-cost", ""], "error: --gpu-cost is empty"),  # priced at the illustrative list
    (["--slo", "ttft_p90=2s", "--block-size", "100"], "power of two"),  # an engine option of sim.replay
    (["--slo", "ttft_p90=2s", "--think-times", "fast"], "argument --think-times: invalid choice: 'fast'"),
    (["--slo", "ttft_p90=2s", "--warmup-fraction", "1"], "--warmup-fraction must be in [0, 1), got 1.0"),
    (["--slo", "ttft_p90=2s", "--stability-tolerance", "0"], "--stability-tolerance must be in (0, 1), got 0.0"),
    (["--slo", "ttft_p90=2s", "--min-duration-s", "0", "--min-requests", "0"], "--min-duration-s and --min-requests"),
    (["--slo", "ttft_p90=2s", "--min-requests", "-1"], "argument --min-requests: -1 must be >= 0"),
    (["--slo", "ttft_p90=2s", "--seeds", "0"], "argument --seeds: 0 must be >= 1"),
    # Tracebacks (OverflowError, TypeError) before these limits:
    (["--slo", "ttft_p90=2s", "--seeds", str(2**70)], "argument --seeds: 1180591620717411303424 is more than 1000"),
    (["--slo", "ttft_p90=2s", "--qps-max", "1e308"], "argument --qps-max: 1e308 requests/s is above the limit"),
    (["--slo", "ttft_p90=2s", "--target-qps", "1e308"], "argument --target-qps: 1e308 requests/s is above the"),
    # Without --max-requests' bound (its default of 100,000 shortens these streams, and the sweep runs):
    (["--slo", "ttft_p90=2s", "--qps-max", "1e6", "--max-requests", "10000000"],
     "requests, more than the 10,000,000 one simulation takes"),
    (["--slo", "ttft_p90=2s", "--min-duration-s", "1e308", "--max-requests", "10000000"], "lower --min-duration-s"),
    (["--slo", "ttft_p90=2s", "--min-requests", str(2**62)], "--min-requests must be from 0 to 10,000,000"),
    # A stream past the trace bound: a TraceError traceback once the first simulation built it.
    (["--slo", "ttft_p90=2s", "--qps-min", "1e-300"], "a stream of 6e+303 s at 1e-300 requests/s lasts longer than "
                                                       "a trace may (1e+12 s); raise --qps-min (at least 6e-09)"),
    (["--slo", "ttft_p90=2s", "--bands", "1"], "--bands must be an integer from 2 to 1000"),
    (["--slo", "ttft_p90=2s", "--bands", "3", "--seeds", "2"], "--bands 3 and --seeds 2: --bands N already runs"),
    # Every request rejected (or too many for the SLO): exit 0, max_qps null and "raise --max-iterations".
    (["--slo", "ttft_p90=2s", "--max-model-len", "1"], "no request of the trace can ever fit (the shortest: prompt"),
    (["--slo", "ttft_p90=2s", "--num-gpu-blocks", "1"], "the cache has 1), and a rejected request counts as "
                                                         "infinitely slow, so ttft_p90=2s fails at every QPS"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS, ids=[m.split(":")[0][:40] for _, m in BAD_INPUTS])
def test_bad_inputs_exit_2_naming_the_option(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([TRACE, "--quiet", "--out", str(tmp_path / "out")] + argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_cost_model_nested_too_deeply_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Arrays nested thousands deep as --cost-model: a RecursionError traceback from the profile's JSON reader."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SystemExit) as exit_info:
        main([TRACE, "--quiet", "--limit", "20", "--slo", "ttft_p90=2s", "--cost-model", str(deep),
              "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.splitlines() == [f"error: configuration 'qwen3-0.6b h200 x1': cost model {deep}: not a readable "
                                   "profile (JSON nested too deeply to read)"]
    assert not (tmp_path / "out").exists()


def test_an_unreachable_slo(tmp_path: Path) -> None:
    """Valid input that ended in a traceback: an SLO no load meets halved the QPS until the stream overflowed a
    trace's 1e12 s. The halving stopped at WorkloadParams.min_qps (test_capacity_bisection), after 36 simulations;
    it now stops once halving the load leaves the failing statistics unchanged, and says no QPS can meet them."""
    common = [TRACE, "--limit", "200", "--jobs", "1", "--quiet", "--no-duration-check", "--min-duration-s", "0"]
    out = tmp_path / "never"
    # The roofline cost model, pinned: the measured profile is recalibrated as machine sessions are added.
    assert main([*common, "--slo", "ttft_p90=0.001ms", "--min-requests", "100", "--max-iterations", "60",
                 "--cost-model", "roofline", "--out", str(out)]) == 0
    (record,) = json.loads((out / "capacity.json").read_text())
    assert record["max_qps"] is None and record["num_simulations"] == 13
    assert record["notes"] == ["no QPS can meet the SLOs: from 0.003076 down to 0.001538 req/s the SLO statistics "
                               "stayed at ttft_p90 5.705 ms, so requests no longer wait for each other there and a "
                               "lower load fails alike: the SLOs are tighter than the configuration serves a request "
                               "alone"]


def test_a_stream_that_holds_no_request(tmp_path: Path) -> None:
    """--min-requests 1 with --min-duration-s 0 drew streams in which no request arrives: the empty trace's
    TraceError was a traceback. An empty stream is now judged as the empty window it is."""
    common = [TRACE, "--limit", "200", "--jobs", "1", "--quiet", "--no-duration-check", "--min-duration-s", "0"]
    out = tmp_path / "empty"
    assert main([*common, "--slo", "ttft_p90=2s", "--min-requests", "1", "--max-iterations", "10",
                 "--out", str(out)]) == 0
    (record,) = json.loads((out / "capacity.json").read_text())
    points = [p for search in record["searches"] for p in search["points"]]
    empty = [p for p in points if p["stream_requests"] == 0]
    assert empty and all(p["feasible"] and p["num_requests"] == 0 and p["num_finished"] == 0 for p in empty)


def test_bands_of_two_searches_hold_the_answer(tmp_path: Path) -> None:
    """--bands 2: max_qps is the lower search's (an even count takes the lower middle, a simulated QPS), but the
    band was interpolated: max_qps 9.45 beside a band median of 11.025 and p5 9.6075, outside its own band."""
    argv = [TRACE, "--limit", "200", "--slo", "ttft_p90=2s", "--cost-model", "roofline", "--min-requests", "100",
            "--min-duration-s", "5", "--max-iterations", "3", "--no-duration-check", "--bands", "2", "--jobs", "1",
            "--quiet", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    (record,) = json.loads((tmp_path / "out" / "capacity.json").read_text())
    low, high = sorted(record["max_qps_by_seed"].values())
    assert low < high and record["max_qps"] == low
    assert record["max_qps_band"] == {"median": low, "p5": low, "p95": high}


def test_missing_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing.parquet"), "--slo", "ttft_p90=2s", "--quiet"])
    assert exit_info.value.code == 2
    assert "error: TRACE: " in capsys.readouterr().err


def test_bands_search_once_per_band_replay_and_report_p5_p95(tmp_path: Path) -> None:
    """--bands 3: three searches, each on its own stream and band replay of the measured profile; the answer is
    their median and capacity.json gives the p5-p95 band of their max QPS."""
    argv = [TRACE, "--limit", "200", "--model", "qwen3-8b", "--gpu", "h200", "--slo", "ttft_p90=2s,tpot_p90=100ms",
            "--tolerance", "0.2", "--max-iterations", "5", "--min-duration-s", "40", "--min-requests", "100",
            "--no-duration-check", "--bands", "3", "--jobs", "1", "--quiet", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    (record,) = json.loads((tmp_path / "out" / "capacity.json").read_text())
    assert sorted(record["max_qps_by_seed"]) == ["0", "1", "2"]
    values = sorted(v for v in record["max_qps_by_seed"].values())
    band = record["max_qps_band"]
    assert band is not None and band["p5"] <= band["median"] <= band["p95"]
    assert values[0] <= band["p5"] and band["p95"] <= values[-1] and record["max_qps"] == values[1]


def test_a_band_replay_perturbs_the_simulated_deployment() -> None:
    """The same stream and QPS, simulated as band replay 0 and plainly: different latencies (host episodes and
    cost-model offsets), and the band replay is a function of its index alone."""
    from analysis.capacity.point import PointJob, evaluate_point
    from analysis.capacity.workload import SessionLibrary, WorkloadParams
    from analysis.slo import parse_slos
    from sim.config import SimConfig
    from traces.schema import load_trace

    library = SessionLibrary.from_trace(load_trace(TRACE).head(200))
    workload = WorkloadParams(min_duration_s=30, min_requests=50)
    slos = parse_slos("ttft_p90=2s")
    config = SimConfig(model="qwen3-8b", gpu="h200")
    plain = evaluate_point(library, workload, slos, PointJob(config, 4.0, 0))
    band = evaluate_point(library, workload, slos, PointJob(config, 4.0, 0, band_replay=True))
    again = evaluate_point(library, workload, slos, PointJob(config, 4.0, 0, band_replay=True))
    assert band.latency_ms != plain.latency_ms and band == again


def test_a_sampled_sweep_priced_as_greedy_says_so_in_its_notes(tmp_path: Path) -> None:
    """--temperature with a profile that measured no sampling (the shipped ones) answers at greedy prices: every
    answer's notes say so, as sim.replay's sampling_not_measured warning does."""
    from sim.profiled_cost_model import profile_path

    profile = json.loads(profile_path("qwen3-0.6b", "h200").read_text())
    profile.pop("sampling_points", None)  # as measured before sim.profile timed sampled steps
    profile["fit"].pop("sampling", None)
    unsampled = tmp_path / "qwen3-0.6b.json"
    unsampled.write_text(json.dumps(profile))
    common = [TRACE, "--limit", "200", "--jobs", "1", "--quiet", "--no-duration-check", "--min-duration-s", "0",
              "--min-requests", "100", "--max-iterations", "3", "--slo", "ttft_p90=2s", "--cost-model", str(unsampled)]
    assert main([*common, "--temperature", "0.6", "--top-k", "20", "--out", str(tmp_path / "sampled")]) == 0
    (record,) = json.loads((tmp_path / "sampled" / "capacity.json").read_text())
    assert record["notes"][0] == ("every request samples with top-k or top-p, but the profile has no sampled steps "
                                  "(measured before python -m sim.profile timed them): steps are priced as greedy "
                                  "ones, short by what the sampler adds")
    assert main([*common, "--out", str(tmp_path / "greedy")]) == 0
    (greedy,) = json.loads((tmp_path / "greedy" / "capacity.json").read_text())
    assert not any("sampl" in note for note in greedy["notes"]) and greedy["max_qps"] == record["max_qps"]
