"""Probe of session 30 (B): the sampling the simulator prices against the rows the engine samples.

Found and fixed:
- ``analysis.capacity --temperature 0.7 --top-k 10**21`` (a top_k the engine takes: past the vocabulary it keeps every
  token, off) wrote capacity.parquet with an Int128 top_k column that pyarrow cannot read -> the largest int64 there.

Probed and found sound (no change): the rows charged the sampler's cost are the engine's sample_rows
(ModelRunner.plan) step by step for chunked prefills, prompts hit in the prefix cache but for their last token (a
one-token chunk, alone or beside prefills), mixed steps, preempted and recomputed sequences, both policies and varying
host speed; the one exception is sampled_rows' documented one: a decode-only step holding a prompt's one-token chunk
that leaves it unfinished (the budget's last token) is charged that row. Traces hold no per-request sampling (every
request takes the run's options, in engine.replay too). sim.replay (--bands too) and analysis.capacity say
sampling_not_measured with --cost-model roofline and with --gpu a100-80g (auto: the roofline). --temperature -1 / nan /
inf / 1e400, --top-k -2 / 1e9 / 2.5 and --top-p 0 / 1.5 / nan / -0.0 are one line and exit 2 in sim.replay,
analysis.capacity and engine.replay alike; --top-k 0, -1 and 10**21 are taken by all three (off).
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from tests.sim.helpers import write_trace


def test_a_top_k_past_int64_leaves_capacity_parquet_readable(tmp_path):
    from analysis.capacity.cli import main

    trace = write_trace(tmp_path / "trace.parquet", [100, 200, 300], [5, 6, 4], [0.0, 0.1, 0.2])
    out = tmp_path / "capacity"
    huge = 10**21
    main([str(trace), "--slo", "ttft_p90=2s", "--quiet", "--out", str(out), "--max-iterations", "1",
          "--min-requests", "2", "--min-duration-s", "0", "--jobs", "1", "--temperature", "0.7", "--top-k", str(huge)])
    table = pq.read_table(out / "capacity.parquet")  # was ArrowNotImplementedError: integers of more than 64 bits
    assert set(table.column("top_k").to_pylist()) == {2**63 - 1}
    assert json.loads((out / "capacity.json").read_text())[0]["options"]["top_k"] == huge


def test_sampled_points_measured_below_greedy_are_named_in_a_warning():
    """A sampled point more than 10 % faster than its greedy twin (qwen3-0.6b's filtered 1- and 8-row steps, timed alone
    after the step launched ahead of them) is no cost to trust: sampling_below_greedy names its row counts and times;
    noise-sized differences, other modes and malformed points say nothing."""
    from sim.config import SimConfig
    from sim.limits import sampling_warning

    def point(mode, bs, median_ms, greedy_ms):
        return {"sampling": mode, "decode": [bs, 1024], "median_s": median_ms / 1e3, "greedy_median_s": greedy_ms / 1e3}

    config = SimConfig(temperature=0.6, top_k=20, top_p=0.95)
    fit = {"sampling": {"filters": {"batch_sizes": [1, 8, 32], "extra_s": [0.0, 0.0, 0.0014]},
                        "temperature": {"batch_sizes": [1], "extra_s": [0.0]}}}
    points = [point("filters", 8, 0.91, 1.52), point("filters", 1, 0.29, 1.43), point("filters", 32, 2.23, 2.24),
              point("temperature", 1, 0.2, 1.43), {"sampling": "filters", "decode": "x"}, "junk"]
    warnings = sampling_warning(config, config.model_shape, {"fit": fit, "sampling_points": points})
    assert [w["code"] for w in warnings] == ["sampling_below_greedy"]
    assert "top-k or top-p at 1, 8 rows" in warnings[0]["message"]
    assert "(0.29 against 1.43 ms, 0.91 against 1.52 ms)" in warnings[0]["message"]
    within_noise = [point("filters", 1, 1.40, 1.43), point("filters", 32, 3.6, 2.24)]
    assert sampling_warning(config, config.model_shape, {"fit": fit, "sampling_points": within_noise}) == []
    greedy = SimConfig()
    assert sampling_warning(greedy, greedy.model_shape, {"fit": fit, "sampling_points": points}) == []
