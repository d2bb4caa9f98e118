"""Sweeps (analysis.capacity.sweep): the cross product, labels, and results that do not depend on parallelism."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from analysis.capacity.bisection import SearchParams
from analysis.capacity.executors import LocalExecutor, SerialExecutor, make_executor
from analysis.capacity.sweep import SweepError, config_label, expand_configs, family_label, run_sweep, varying_axes
from analysis.slo import parse_slos
from sim.config import SimConfig
from traces.schema import load_trace

TRACE_PATH = Path(__file__).resolve().parents[2] / "traces" / "sharegpt.parquet"
# An 8B model on an L40S saturates within 120 requests, so the searches bisect rather than run away.
# The roofline cost model is pinned so a measured profile added later cannot change what is tested.
BASE = SimConfig(model="qwen3-8b", gpu="l40s", cost_model="roofline")
SLOS = parse_slos("ttft_p90=500ms,tpot_p90=50ms")
PARAMS = SearchParams(start_qps=6.0, tolerance=0.1, max_iterations=6)


@pytest.fixture(scope="module")
def small_trace():
    return load_trace(TRACE_PATH).head(120)


def test_cross_product_order_and_untouched_fields() -> None:
    base = SimConfig(block_size=128)
    configs = expand_configs(base, {"policy": ["mixed", "nano"], "num_replicas": [1, 2], "model": ["qwen3-0.6b"]})
    assert [(c.num_replicas, c.policy) for c in configs] == [(1, "mixed"), (1, "nano"), (2, "mixed"), (2, "nano")]
    assert {c.block_size for c in configs} == {128}
    assert len(expand_configs(base, {"gpu": ["h200", "h100"], "router": ["rr", "lor", "prefix"],
                                     "max_num_seqs": [8, 64], "tensor_parallel_size": [1, 2]})) == 24


def test_cross_product_errors_name_the_option() -> None:
    with pytest.raises(SweepError, match="--replicas: empty list"):
        expand_configs(SimConfig(), {"num_replicas": []})
    with pytest.raises(SweepError, match="cannot sweep block_size"):
        expand_configs(SimConfig(), {"block_size": [16]})


def test_labels_name_what_varies() -> None:
    configs = expand_configs(SimConfig(), {"num_replicas": [1, 2], "router": ["rr", "prefix"]})
    varying = varying_axes(configs)
    assert varying == ["num_replicas", "router"]
    assert [config_label(c, varying) for c in configs] == ["x1 router rr", "x1 router prefix", "x2 router rr",
                                                           "x2 router prefix"]
    assert family_label(configs[3], varying) == "router prefix"
    assert config_label(SimConfig(), []) == "qwen3-0.6b h200 x1"
    assert family_label(SimConfig(), ["num_replicas"]) == "qwen3-0.6b h200"


class _Bar:
    """Records what run_sweep tells a progress bar."""

    def __init__(self) -> None:
        self.total = None
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n

    def refresh(self) -> None:
        pass


def test_serial_and_parallel_sweeps_give_identical_results(small_trace) -> None:
    configs = expand_configs(BASE, {"num_replicas": [1, 2]})
    bar = _Bar()
    serial = run_sweep(configs, PARAMS, SerialExecutor(small_trace, SLOS), progress_bar=bar)
    parallel = run_sweep(configs, PARAMS, LocalExecutor(small_trace, SLOS, num_jobs=2))
    assert [r.outcome for r in serial] == [r.outcome for r in parallel]
    assert [r.points for r in serial] == [r.points for r in parallel]
    assert all(r.outcome.converged and r.outcome.monotone for r in serial)
    assert serial[1].max_qps > serial[0].max_qps  # two replicas serve more
    num_simulations = sum(len(r.points) for r in serial)
    assert bar.n == num_simulations and bar.total == num_simulations  # the bar's total shrank to the truth


def test_k_section_runs_the_same_in_parallel(small_trace) -> None:
    configs = expand_configs(BASE, {"num_replicas": [2]})
    params = SearchParams(start_qps=6.0, tolerance=0.1, max_iterations=7, candidates_per_round=2)
    serial = run_sweep(configs, params, make_executor(small_trace, SLOS, 1))
    parallel = run_sweep(configs, params, make_executor(small_trace, SLOS, 2))
    assert serial[0].outcome == parallel[0].outcome and serial[0].points == parallel[0].points
    assert len(serial[0].points) >= 5


def test_points_record_the_slo_values_and_goodput(small_trace) -> None:
    (result,) = run_sweep(expand_configs(BASE, {}), SearchParams(qps_min=3.0, qps_max=6.0, max_iterations=2),
                          SerialExecutor(small_trace, SLOS))
    assert [p.qps for p in result.points] == [3.0, 6.0]
    limits_ms = {slo.key: slo.limit_ms for slo in SLOS}
    for point in result.points:
        assert set(point.slo_values_ms) == set(limits_ms)
        within = all(v is not None and v <= limits_ms[key] for key, v in point.slo_values_ms.items())
        assert point.meets_slos == within
        assert point.num_requests == 120 and point.num_rejected == 0
        assert point.arrival_span_s == pytest.approx(119 / point.qps, rel=1e-5)  # 6 significant digits
        assert 0 <= point.goodput_rps <= point.num_finished / point.duration_s
        assert set(point.latency_ms) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}
    passing = [p for p in result.points if p.meets_slos]
    assert result.point_at_max is (passing[-1] if passing else None)


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="ray is installed")
def test_ray_without_ray_is_a_clear_error(small_trace) -> None:
    with pytest.raises(SweepError, match="--ray: the 'ray' package is not installed"):
        make_executor(small_trace, SLOS, 2, ray_address="auto")
