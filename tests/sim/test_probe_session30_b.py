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
sampling_not_measured with --cost-model roofline and with --gpu h100 (auto: the roofline). --temperature -1 / nan /
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
