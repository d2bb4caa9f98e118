"""Probe W (session 27): analysis.capacity's answers against brute force, early stops, parallelism and the cost figures.

What the probe found:

- A trace with prompts the configuration can never fit refused an ITL SLO as failing at every QPS when their share of
  the requests broke it, but ITL pools every gap between tokens and counts a rejected request as one infinite gap
  among them (slo_check): 16 % of sharegpt's first 300 prompts beyond --max-model-len 2500 refused itl_p99=50ms,
  where the sweep now finds 61.95 req/s (every load that passed with an ITL p99 of 2-14 ms). The refusal takes a
  rejected request's share of ITL's samples.
- The other way for TPOT, which has no sample of a one-token output: 30 % rejected requests and 60 % one-token ones
  (3 of TPOT's 4 samples infinite) were simulated under tpot_p50, every load failed, and the note blamed an SLO
  tighter than a request served alone; now refused before any simulation, naming the rejected prompts.
- --slo ttft_p90=1e308s (1e311 ms, beyond the floats) wrote "Infinity" into capacity.json's slos_ms, which no strict
  JSON reader takes (sim.replay simulated, then could not write summary.json and blamed its cost model); a limit
  above 1e305 s is now refused as the SLO is parsed.

Checked and found right: each point of a search (probe and certain-miss early stops included) against the same
load simulated in full, and max_qps against a brute-force grid of full simulations (synthetic traces, 1-2 replicas,
2 seeds, k-section); --jobs 2 writing the capacity.json of --jobs 1 (with --seeds, --bands, k-section); the cost
figures (max_qps x output tokens per measured request; replicas x TP x price / tokens per hour); SLO parsing of
p0/p100, duplicates, signs, case and units.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.slo import SLO, parse_slos
from tests.traces.helpers import cli_error
from traces.schema import save_trace


def _trace_with_prompts_that_never_fit(tmp_path):
    """100 requests a second apart, 20 of them with prompts beyond the model's max_model_len (40960)."""
    path = tmp_path / "trace.parquet"
    n = 100
    save_trace(pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": [float(i) for i in range(n)],
                             "prompt_tokens": [100, 100, 100, 100, 100_000] * 20, "output_tokens": [50] * n}), path)
    return path


def _never_fit_refusal(num_rejected: int, slo: str) -> str:
    """The refusal of an SLO that the trace's 100,000-token prompts (of 100 requests) fail at every QPS."""
    return (f"error: configuration 'qwen3-0.6b h200 x1': {num_rejected} of 100 requests of the trace can never fit "
            "(the shortest of them: prompt has 100000 tokens, more than max_model_len=40960), and a rejected request "
            f"counts as infinitely slow, so {slo} fails at every QPS; expected a configuration that serves the "
            "trace's prompts")


def test_rejections_that_break_a_percentile_of_requests_do_not_refuse_an_itl_slo(tmp_path, capsys) -> None:
    trace = _trace_with_prompts_that_never_fit(tmp_path)
    common = [str(trace), "--min-duration-s", "5", "--min-requests", "40", "--max-iterations", "1",
              "--no-duration-check", "--jobs", "1", "--quiet"]
    # 20 % rejected requests break any p99 taken over requests: still refused, before any simulation.
    line = cli_error(capacity_main, [*common, "--slo", "ttft_p99=1s", "--out", str(tmp_path / "ttft")], capsys)
    assert line == _never_fit_refusal(20, "ttft_p99=1s")
    # ITL's samples are the 80 x 49 gaps of the served requests and one infinite gap per rejected one (20 in 3,940):
    # its p99 is a gap between tokens, met at the one load tried (6 of its 30 measured requests rejected).
    out = tmp_path / "itl"
    assert capacity_main([*common, "--slo", "itl_p99=1s", "--out", str(out)]) == 0
    [record] = json.loads((out / "capacity.json").read_text())
    [point] = record["searches"][0]["points"]
    assert (point["qps"], point["feasible"], point["num_requests"], point["num_rejected"]) == (1.0, True, 30, 6)
    assert point["slo_values_ms"]["itl_p99"] < 1000
    assert record["max_qps"] == 1.0 and record["max_qps_kind"] == "lower_bound"
    assert record["notes"][0].startswith("20 of 100 requests of the trace (20.0%) can never fit")


def test_rejections_that_break_tpot_among_its_samples_refuse_a_tpot_slo(tmp_path, capsys) -> None:
    # Of every 10 requests: 3 prompts beyond max_model_len (rejected), 6 one-token outputs (no TPOT sample), 1 served
    # with 50 tokens: 30 % of the requests, but 3 of TPOT's 4 samples, are infinite, so tpot_p50 fails at every QPS.
    path = tmp_path / "trace.parquet"
    n = 100
    save_trace(pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": [float(i) for i in range(n)],
                             "prompt_tokens": ([100] * 7 + [100_000] * 3) * 10,
                             "output_tokens": ([1] * 6 + [50] * 4) * 10}), path)
    common = [str(path), "--min-duration-s", "5", "--min-requests", "40", "--no-duration-check", "--jobs", "1",
              "--quiet"]
    # Before: simulated, every load failed, and the note blamed an SLO tighter than a request served alone.
    line = cli_error(capacity_main, [*common, "--slo", "tpot_p50=1s", "--out", str(tmp_path / "tpot")], capsys)
    assert line == _never_fit_refusal(30, "tpot_p50=1s")
    assert not (tmp_path / "tpot").exists()
    # The same rejections among the requests (30 %, and the margin a stream may draw below it) leave a TTFT p50 to
    # the load: simulated, with the note.
    out = tmp_path / "ttft"
    assert capacity_main([*common, "--slo", "ttft_p50=1s", "--max-iterations", "1", "--out", str(out)]) == 0
    [record] = json.loads((out / "capacity.json").read_text())
    assert record["notes"][0].startswith("30 of 100 requests of the trace (30.0%) can never fit")


def _strict_json(text: str):
    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_slo_limit_beyond_the_float_range_in_ms_is_refused_before_any_simulation(tmp_path, capsys) -> None:
    trace = _trace_with_prompts_that_never_fit(tmp_path)
    common = [str(trace), "--min-duration-s", "5", "--min-requests", "40", "--max-iterations", "1",
              "--no-duration-check", "--jobs", "1", "--quiet"]
    # 1e308 s is 1e311 ms, beyond the floats: capacity.json's slos_ms said Infinity (no strict JSON reader takes it).
    line = cli_error(capacity_main, [*common, "--slo", "itl_p99=1e308s", "--out", str(tmp_path / "big")], capsys)
    assert line == ("error: argument --slo: SLO 'itl_p99=1e308s': SLO limit must be at most 1e+305 seconds (outputs "
                    "keep it in ms), got 1e+308 (--help lists the options)")
    assert not (tmp_path / "big").exists()
    assert parse_slos("ttft_p90=1e308ms") == (SLO("ttft", "p90", 1e305),)  # the largest: 1e308 ms, a float
    with pytest.raises(ValueError, match=r"^SLO 'ttft_p90=1.0000001e308ms': SLO limit must be at most 1e\+305 "):
        parse_slos("ttft_p90=1.0000001e308ms")
    # At the largest limit the file is strict JSON, its limit the float it was given.
    out = tmp_path / "largest"
    assert capacity_main([*common, "--slo", "itl_p99=1e305s", "--out", str(out)]) == 0
    [record] = _strict_json((out / "capacity.json").read_text())
    assert record["slos_ms"] == {"itl_p99": 1e308}
