"""Probe Z (session 28): a capacity sweep of a trace of tiny requests, whose streams grew to millions of requests.

Input: a trace of two requests a second apart (prompts of 10 and 12 tokens, outputs of 5 and 3) and
``python -m analysis.capacity TRACE --slo ttft_p90=1s``.

Before: every stream lasted max(--min-duration-s, --min-requests / QPS), 240 s by default, whatever it held. The
engine serves such requests at thousands of req/s, so the search doubled on and each stream held QPS x 240 requests:
983,040 at 4,096 req/s and 3.9 million at 16,384, a minute and more per simulation on a 2-core machine; after 4
minutes the sweep was at its 13th simulation of 23, after 10 at its 16th: something close to a hang. The only bound
was the 10,000,000 requests one simulation takes.

Now: --max-requests N (default 100,000, or --min-requests when higher) bounds the requests a stream holds; above
N / --min-duration-s (~417 req/s by default) a stream lasts N / QPS seconds instead (an answer's check on a stream
twice as long, twice that). The notes in capacity.json and in the printed table count the shortened simulations,
name the option and, for an answer judged on a shortened stream, give its measured window against the p99
end-to-end latency: the steady-state check is called unreliable where its 24 backlog samples are closer together
than that latency. The tiny trace's default sweep: 20 simulations in ~2 minutes (123 s wall with --jobs 1),
1.075e4 req/s, converged. traces/sharegpt.parquet's default sweep (largest stream 20,140 requests, its 2T check) is
byte for byte what it was. Hostile --max-requests values are one-line errors, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import build_parser
from analysis.capacity.cli import main as capacity_main
from analysis.capacity.plan import plan_sweep
from analysis.capacity.sweep import shortened_notes
from analysis.capacity.workload import DEFAULT_MAX_REQUESTS, WorkloadParams
from sim.config import SimConfig
from tests.analysis.capacity_results import config_result
from tests.traces.helpers import cli_error
from traces.schema import save_trace

REPO = Path(__file__).resolve().parents[2]
SHAREGPT = str(REPO / "traces" / "sharegpt.parquet")


@pytest.fixture()
def tiny_trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.parquet"
    save_trace(pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 12],
                             "output_tokens": [5, 3]}), path)
    return path


def test_the_tiny_trace_sweeps_in_seconds_with_its_shortened_streams_noted(tiny_trace, tmp_path, capsys) -> None:
    """The whole sweep, end to end: ~8 CPU s (the 240 s streams of before: most of an hour)."""
    out = tmp_path / "cap"
    assert capacity_main([str(tiny_trace), "--slo", "ttft_p90=1s", "--max-requests", "3000", "--jobs", "1",
                          "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    [record] = json.loads((out / "capacity.json").read_text())
    assert (record["max_qps"], record["max_qps_kind"], record["num_simulations"]) == (10752.0, "converged", 20)
    [search] = record["searches"]
    points = [(p["qps"], p["stream_requests"], p["feasible"]) for p in search["points"]]
    doublings = [(float(2**i), 3000, True) for i in range(14)]  # 1 ... 8,192 req/s, every one 3,000 requests
    assert points == doublings + [(16384.0, 3000, False), (12288.0, 3000, False), (10240.0, 3001, True),
                                  (11264.0, 3000, False), (10752.0, 3000, True)]
    # Below 12.5 req/s --min-requests sets the length (3,000 s at 1 req/s); above, 3,000 / QPS seconds, not 240.
    assert [p["stream_duration_s"] for p in search["points"][:6]] == [3000.0, 1500.0, 750.0, 375.0, 187.5, 93.75]
    assert search["points"][-1]["stream_duration_s"] == 0.279018  # 3,000 / 10,752 s
    [check] = search["duration_checks"]
    assert (check["qps"], check["stream_requests"], check["stream_duration_s"], check["feasible"]) == (
        10752.0, 6001, 0.558036, True)
    assert record["notes"] == [
        "16 of 20 simulations ran a shortened stream: above 12.5 req/s, --min-duration-s 240 s would hold more than "
        "--max-requests 3,000 requests, so those streams last 3,000 / QPS seconds (a check of an answer twice that) "
        "and hold about that many",
        "the answer 1.075e+04 req/s was judged on a stream of 0.279 s, shortened by --max-requests 3,000 from "
        "--min-duration-s 240 s (0.2093 s measured, 2,250 requests; its check twice that): that window spans only "
        "5.86 times the p99 end-to-end latency (35.72 ms): the steady-state check's 24 backlog samples are closer "
        "together than a request takes, so its verdict that the load is sustained is unreliable; raise "
        "--max-requests (to 2,580,480 at this QPS) to simulate --min-duration-s in full",
    ]
    for note in record["notes"]:  # the printed table says it too
        assert f"  qwen3-0.6b h200 x1: {note}" in printed.splitlines()
    assert ("resampled into a stream of at least 240 s and 3000 requests at each QPS tried, at most 3,000 "
            "(--max-requests: shorter than 240 s above 12.5 req/s; see the notes)") in (out / "report.html").read_text()


def test_the_default_bound_shortens_streams_above_417_requests_per_second_only() -> None:
    workload = WorkloadParams(max_requests=DEFAULT_MAX_REQUESTS)
    assert DEFAULT_MAX_REQUESTS == 100_000
    assert workload.shortened_above_qps() == pytest.approx(416.6666666666667)
    # At sharegpt's capacities (and twice them) exactly the lengths of before: max(240 s, 3,000 / QPS).
    for qps in (5.98, 41.86, 74.75, 117.012, 234.024, 416.0):
        assert not workload.shortened(qps)
        assert workload.duration_s(qps) == WorkloadParams().duration_s(qps) == max(240.0, 3000 / qps)
        assert workload.duration_s(qps, 2.0) == WorkloadParams().duration_s(qps, 2.0)
    assert workload.shortened(417.0)
    assert workload.duration_s(10752.0) == 100_000 / 10752.0
    assert workload.duration_s(10752.0, 2.0) == 2 * 100_000 / 10752.0
    # No --min-duration-s: --min-requests alone sets every length, and nothing is ever shortened.
    assert WorkloadParams(min_duration_s=0.0, min_requests=100, max_requests=100).shortened_above_qps() is None
    assert not WorkloadParams(min_duration_s=0.0, min_requests=100, max_requests=100).shortened(1e9)
    # The library API without the option: no bound (the CLI passes its default).
    assert WorkloadParams().max_requests is None and not WorkloadParams().shortened(1e9)


def _plan(argv: list[str]):
    parser = build_parser()
    return plan_sweep(parser, parser.parse_args(argv))


def test_the_default_rises_to_min_requests(tiny_trace) -> None:
    common = [str(tiny_trace), "--slo", "ttft_p90=1s"]
    assert _plan(common).workload.max_requests == 100_000
    assert _plan([*common, "--min-requests", "250000"]).workload.max_requests == 250_000
    assert _plan([*common, "--min-requests", "0", "--max-requests", "100"]).workload.max_requests == 100


@pytest.mark.parametrize(("value", "message"), [
    ("0", "argument --max-requests: 0 must be from 100 (fewer measured requests are noise) to 10,000,000 (what one "
          "simulation takes)"),
    ("-5", "argument --max-requests: -5 must be from 100"),
    ("99", "argument --max-requests: 99 must be from 100"),
    ("10000001", "argument --max-requests: 10000001 must be from 100"),
    (str(2**70), "argument --max-requests: 1180591620717411303424 must be from 100"),
    ("9" * 5000, "argument --max-requests: 999999999999999999999999999999... is not an integer from 100 to "
                 "10,000,000"),
    ("1.5", "argument --max-requests: '1.5' is not an integer"),
    ("1e5", "argument --max-requests: '1e5' is not an integer"),
    ("nan", "argument --max-requests: 'nan' is not an integer"),
    ("inf", "argument --max-requests: 'inf' is not an integer"),
    ("", "argument --max-requests: '' is not an integer"),
    ("abc", "argument --max-requests: 'abc' is not an integer"),
])
def test_hostile_max_requests_is_one_line(value: str, message: str, tiny_trace, tmp_path, capsys) -> None:
    line = cli_error(capacity_main, [str(tiny_trace), "--slo", "ttft_p90=1s", "--out", str(tmp_path / "o"),
                                     f"--max-requests={value}"], capsys)
    assert line.startswith(f"error: {message}")
    assert not (tmp_path / "o").exists()


def test_max_requests_below_min_requests_is_refused(tiny_trace, tmp_path, capsys) -> None:
    line = cli_error(capacity_main, [str(tiny_trace), "--slo", "ttft_p90=1s", "--max-requests", "1000",
                                     "--out", str(tmp_path / "o")], capsys)
    assert line == ("error: --max-requests 1000 is below --min-requests 3000: a stream cannot hold at most fewer "
                    "requests than it must hold at least; raise --max-requests or lower --min-requests")


def _answer(max_qps: float, e2e_p99_ms: float, stream_duration_s: float, warmup_s: float, requests: int):
    """A converged answer at max_qps, its point (and its check) with these figures."""
    result = config_result(0, SimConfig(), max_qps)
    [search] = result.searches
    point = dataclasses.replace(search.points[0], stream_duration_s=stream_duration_s, warmup_s=warmup_s,
                                num_requests=requests, latency_ms={"e2e_ms": {"p99": e2e_p99_ms}})
    check = dataclasses.replace(point, duration_scale=2.0)
    return dataclasses.replace(result, searches=(dataclasses.replace(search, points=(point,), checks=(check,)),))


def test_a_long_enough_shortened_window_is_still_said_to_miss_slow_queues() -> None:
    workload = WorkloadParams(max_requests=DEFAULT_MAX_REQUESTS)
    result = _answer(2000.0, 250.0, 50.0, 12.5, 75_000)
    assert shortened_notes(result, workload) == (
        "2 of 2 simulations ran a shortened stream: above 416.7 req/s, --min-duration-s 240 s would hold more than "
        "--max-requests 100,000 requests, so those streams last 100,000 / QPS seconds (a check of an answer twice "
        "that) and hold about that many",
        "the answer 2000 req/s was judged on a stream of 50 s, shortened by --max-requests 100,000 from "
        "--min-duration-s 240 s (37.5 s measured, 75,000 requests; its check twice that): that window spans 150 times "
        "the p99 end-to-end latency (250 ms), so a queue building within it shows, but one building more slowly, or a "
        "transient longer than 37.5 s, would not; raise --max-requests (to 480,000 at this QPS) to simulate "
        "--min-duration-s in full",
    )
    # The same answer with requests of 2 s: 18.75 of them in the window, fewer than the 24 backlog samples.
    assert shortened_notes(_answer(2000.0, 2000.0, 50.0, 12.5, 75_000), workload)[1].endswith(
        "that window spans only 18.8 times the p99 end-to-end latency (2000 ms): the steady-state check's 24 backlog "
        "samples are closer together than a request takes, so its verdict that the load is sustained is unreliable; "
        "raise --max-requests (to 480,000 at this QPS) to simulate --min-duration-s in full")
    # Unshortened: nothing to say.
    assert shortened_notes(_answer(400.0, 250.0, 240.0, 60.0, 72_000), workload) == ()


def _capacity_json(out: Path) -> tuple[bytes, pl.DataFrame]:
    return (out / "capacity.json").read_bytes(), pl.read_parquet(out / "capacity.parquet")


def _same_with_no_bound(common: list[str], tmp_path: Path) -> dict:
    """The sweep with the default bound and with none: the same files; returns the one configuration's record."""
    assert capacity_main([*common, "--out", str(tmp_path / "default")]) == 0
    assert capacity_main([*common, "--max-requests", "10000000", "--out", str(tmp_path / "unbounded")]) == 0
    default, unbounded = _capacity_json(tmp_path / "default"), _capacity_json(tmp_path / "unbounded")
    assert default[0] == unbounded[0] and default[1].equals(unbounded[1])
    [record] = json.loads(default[0])
    return record


def test_a_short_sweep_of_sharegpt_is_what_it_was(tmp_path) -> None:
    """60 s streams: the figures the tree before this change wrote (git archive 388c41c), and the same files with
    no bound at all."""
    common = [SHAREGPT, "--slo", "ttft_p90=2s,tpot_p90=100ms", "--min-duration-s", "60", "--min-requests", "150",
              "--jobs", "1", "--quiet"]
    record = _same_with_no_bound(common, tmp_path)
    assert (record["max_qps"], record["max_qps_kind"], record["num_simulations"], record["notes"]) == (
        38.87, "converged", 9, [])
    [search] = record["searches"]
    assert [(p["qps"], p["stream_requests"], p["feasible"]) for p in search["points"]] == [
        (5.98, 336, True), (11.96, 749, True), (23.92, 1415, True), (47.84, 1797, False), (35.88, 2168, True),
        (41.86, 2627, False), (38.87, 2433, True), (40.365, 2491, False)]
    assert [(c["qps"], c["stream_requests"]) for c in search["duration_checks"]] == [(38.87, 4853)]


@pytest.mark.slow
def test_the_default_sweep_of_sharegpt_is_what_it_was(tmp_path) -> None:
    """The README's default sweep (240 s streams): the tree before wrote these figures (git archive 388c41c, its
    capacity.json byte for byte the one now); its largest stream, the 2T check, holds 20,140 requests."""
    common = [SHAREGPT, "--slo", "ttft_p90=2s,tpot_p90=100ms", "--jobs", "2", "--quiet"]
    record = _same_with_no_bound(common, tmp_path)
    assert (record["max_qps"], record["max_qps_kind"], record["num_simulations"], record["notes"]) == (
        41.86, "converged", 9, [])
    [search] = record["searches"]
    assert [(p["qps"], p["stream_requests"], p["feasible"]) for p in search["points"]] == [
        (5.98, 3049, True), (11.96, 3205, True), (23.92, 5733, True), (47.84, 4000, False), (35.88, 8931, True),
        (41.86, 10175, True), (44.85, 3666, False), (43.355, 4138, False)]
    assert [(c["qps"], c["stream_requests"]) for c in search["duration_checks"]] == [(41.86, 20140)]
