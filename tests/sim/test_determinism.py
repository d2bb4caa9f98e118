"""Same trace, options and seed: identical requests, steps and summary (wall-clock fields aside)."""

from __future__ import annotations

import re

import pytest

from sim.config import SimConfig
from sim.simulator import simulate
from tests.sim.helpers import SHAREGPT, assert_frames_equal, read_outputs, result_tables, run_cli, without_wall_clock
from traces.schema import load_trace

# Enough load and a small enough cache that batching, chunking, prefix hits and preemptions all happen.
BUSY = dict(num_replicas=2, router="rr", num_gpu_blocks=60, max_num_seqs=32, max_num_batched_tokens=2048, seed=3)


@pytest.fixture(scope="module")
def busy_trace():
    return load_trace(SHAREGPT).head(300).with_qps(40.0)


def test_simulate_twice_gives_identical_tables(busy_trace) -> None:
    config = SimConfig(**BUSY)
    first = simulate(busy_trace, config)
    # Another simulation in between must leave no state behind (caches, counters, routers).
    simulate(busy_trace, SimConfig(policy="nano", num_gpu_blocks=500))
    second = simulate(busy_trace, config)
    requests_1, steps_1 = result_tables(first)
    requests_2, steps_2 = result_tables(second)
    assert requests_1["num_preemptions"].sum() > 0 and requests_1["cached_tokens"].sum() > 0  # the run is not trivial
    assert_frames_equal(requests_1, requests_2, "requests")
    assert_frames_equal(steps_1, steps_2, "steps")
    assert without_wall_clock(first.describe()) == without_wall_clock(second.describe())


def test_cli_twice_gives_identical_outputs(tmp_path) -> None:
    args = [
        SHAREGPT, "--limit", 300, "--qps", 40, "--replicas", 2, "--router", "lor", "--num-gpu-blocks", 60,
        "--max-num-seqs", 32, "--max-num-batched-tokens", 2048, "--seed", 3, "--quiet",
    ]
    outs = []
    # Different hash seeds: nothing may depend on the iteration order of sets or str-keyed dicts.
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}"
        proc = run_cli([*args, "--out", out], env={"PYTHONHASHSEED": hash_seed})
        assert proc.returncode == 0, proc.stderr
        outs.append(read_outputs(out))
    (requests_1, steps_1, summary_1), (requests_2, steps_2, summary_2) = outs
    assert summary_1["num_preemptions"] > 0
    assert_frames_equal(requests_1, requests_2, "requests.parquet")
    assert_frames_equal(steps_1, steps_2, "steps.parquet")
    assert "simulator_wall_s" in summary_1["config"]
    assert without_wall_clock(summary_1) == without_wall_clock(summary_2)
    # The report differs only in the random ids Plotly gives its figure divs.
    reports = [_without_div_ids((tmp_path / f"run{seed}" / "report.html").read_text()) for seed in ("1", "2")]
    assert reports[0] == reports[1]


def _without_div_ids(html: str) -> str:
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UUID", html)
