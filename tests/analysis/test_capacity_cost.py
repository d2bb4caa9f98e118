"""Cost per million output tokens, the cost/latency Pareto front and replicas needed, with exact numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.capacity.cost import (
    DEFAULT_GPU_COST_PER_HOUR_USD,
    assess,
    cost_per_million_output_tokens_usd,
    load_gpu_costs,
    pareto_front,
    replicas_needed,
)
from sim.config import SimConfig
from sim.hardware import GPUS
from tests.analysis.capacity_results import config_result as _result


def test_defaults_price_every_supported_gpu() -> None:
    assert set(DEFAULT_GPU_COST_PER_HOUR_USD) == set(GPUS)


def test_cost_per_million_output_tokens() -> None:
    # 2 replicas x 1 GPU x $3.50 = $7/h; 3000 tok/s = 10.8M tok/h.
    assert cost_per_million_output_tokens_usd(2, 1, 3.5, 3000.0) == pytest.approx(7.0 / 10.8)
    # 1 replica x TP 2 x $2.50 = $5/h; 1000 tok/s = 3.6M tok/h.
    assert cost_per_million_output_tokens_usd(1, 2, 2.5, 1000.0) == pytest.approx(5.0 / 3.6)
    assert cost_per_million_output_tokens_usd(1, 1, 3.5, 0.0) is None


def test_pareto_front() -> None:
    points = [(1.0, 10.0), (2.0, 5.0), (3.0, 5.0), (1.0, 12.0), None, (0.5, 20.0), (2.0, 5.0)]
    assert pareto_front(points) == [True, True, False, False, False, True, True]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 1.0)]) == [True]


def test_replicas_needed_measured_and_extrapolated() -> None:
    measured = {1: 40.0, 2: 100.0, 4: 190.0}
    answer = replicas_needed(measured, 90.0)
    assert (answer.num_replicas, answer.extrapolated) == (2, False)
    assert answer.note == "measured: 2 replica(s) reach 100 req/s"
    beyond = replicas_needed({1: 40.0, 2: 100.0}, 250.0)  # 50 req/s per replica at 2 replicas
    assert (beyond.num_replicas, beyond.extrapolated) == (5, True)
    assert "extrapolated linearly from 2 replica(s) at 100 req/s (50 req/s per replica)" in beyond.note
    assert replicas_needed({1: 40.0, 2: 100.0}, 200.0).num_replicas == 4  # exactly 4 x 50
    assert replicas_needed({1: None, 2: 30.0}, 100.0).num_replicas == 7  # ceil(100 / 15)
    nothing = replicas_needed({1: None}, 5.0)
    assert nothing.num_replicas is None and "no measured replica count" in nothing.note


def test_load_gpu_costs(tmp_path: Path) -> None:
    assert load_gpu_costs(None) == DEFAULT_GPU_COST_PER_HOUR_USD
    inline = load_gpu_costs("h200=4, H100=2")
    assert inline["h200"] == 4.0 and inline["h100"] == 2.0 and inline["l40s"] == DEFAULT_GPU_COST_PER_HOUR_USD["l40s"]
    as_json = tmp_path / "prices.json"
    as_json.write_text(json.dumps({"h200": 5.25}))
    assert load_gpu_costs(str(as_json))["h200"] == 5.25
    as_lines = tmp_path / "prices.txt"
    as_lines.write_text("# my prices\nh200 = 3.0\n\na100-80g=1.2  # spot\n")
    prices = load_gpu_costs(str(as_lines))
    assert (prices["h200"], prices["a100-80g"]) == (3.0, 1.2)


def test_a_price_file_may_start_with_a_byte_order_mark(tmp_path: Path) -> None:
    """A price file saved by Notepad starts with a BOM: it was refused as "unknown GPU '\\ufeffh200'"."""
    lines, obj = tmp_path / "prices.txt", tmp_path / "prices.json"
    lines.write_bytes(b"\xef\xbb\xbfh200=3\r\n")
    obj.write_bytes(b'\xef\xbb\xbf{"h200": 3}')
    assert load_gpu_costs(str(lines))["h200"] == load_gpu_costs(str(obj))["h200"] == 3.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("h900=1", "unknown GPU 'h900'; supported: h200, h100, a100-80g, l40s"),
        ("h200=abc", "price of 'h200' is 'abc'"),
        ("h200=-1", "^--gpu-cost: price of 'h200' must be a number of USD per GPU-hour above 0 and at most 10000, "
                    "got '-1'$"),
        # Each was accepted: a free GPU won every comparison; 1e308 made two replicas' cost inf, written as none;
        # float() read '1_000' and the Arabic-Indic digit three.
        ("h200=0", "must be a number of USD per GPU-hour above 0 and at most 10000, got '0'$"),
        ("h200=1e308", "above 0 and at most 10000, got '1e308'$"),
        ("h200=1_000", "^--gpu-cost: price of 'h200' is '1_000', expected a number of USD per GPU-hour$"),
        ("h200=\u0663", "price of 'h200' is '\u0663', expected a number"),
        ("h200", "neither a file nor GPU=USD_PER_HOUR pairs"),
        ("h200=1,l40s", "cannot parse 'l40s'"),
        # Each was accepted: the last price won, or the illustrative list prices were used without a word.
        ("h200=1,H200=2", "^--gpu-cost: h200 is priced twice \\(1 and 2\\); give one price per GPU$"),
        ("", "^--gpu-cost is empty; expected GPU=USD_PER_HOUR pairs"),
        ("  ", "^--gpu-cost is empty"),
    ],
)
def test_bad_gpu_costs(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_gpu_costs(spec)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"h200": 1, "h200": 2}', "h200 is priced twice \\(1 and 2\\)"),  # json.loads kept the last
        (b"h200=1\nh200=2\n", "h200 is priced twice \\(1 and 2\\)"),
        (b'{"h200": true}', "price of 'h200' is True, expected a number of USD per GPU-hour"),  # was 1.0
        (b"# nothing yet\n", "no price in it; expected a JSON object or gpu=price lines"),  # was the defaults
        (b"h200=\xff\n", "not UTF-8 text"),  # named no file
    ],
)
def test_bad_gpu_cost_files_name_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "prices.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^{path}: {message}"):
        load_gpu_costs(str(path))


def test_assess_combines_cost_pareto_and_replicas() -> None:
    results = [
        _result(0, SimConfig(num_replicas=1), 10.0, ttft_p90_ms=500.0),  # 300 tok/request -> 3000 tok/s
        _result(1, SimConfig(num_replicas=2), 25.0, ttft_p90_ms=400.0),  # 7500 tok/s
        _result(2, SimConfig(num_replicas=1, tensor_parallel_size=2), 12.0, ttft_p90_ms=450.0),
        _result(3, SimConfig(num_replicas=1, gpu="l40s"), None),
    ]
    rows = assess(results, {"h200": 3.5, "l40s": 1.0}, target_qps=40.0, pareto_key="ttft_p90")
    assert [r.num_gpus for r in rows] == [1, 2, 2, 1]
    assert rows[0].output_tokens_per_s == 3000.0
    assert rows[0].cost_per_million_output_tokens_usd == pytest.approx(3.5 / 10.8)
    assert rows[1].cost_per_million_output_tokens_usd == pytest.approx(7.0 / 27.0)
    assert rows[2].cost_per_million_output_tokens_usd == pytest.approx(7.0 / 12.96)
    assert rows[3].cost_per_million_output_tokens_usd is None and rows[3].pareto_latency_ms is None
    # (0.324, 500) and (0.259, 400): the second dominates the first and (0.540, 450).
    assert [r.on_pareto_front for r in rows] == [False, True, False, False]
    # Replica counts 1 and 2 of the default family: 40 req/s > 25, so extrapolate 12.5 per replica.
    assert rows[0].replicas_needed == rows[1].replicas_needed
    assert (rows[0].replicas_needed.num_replicas, rows[0].replicas_needed.extrapolated) == (4, True)
    assert rows[2].replicas_needed.num_replicas == 4  # ceil(40 / 12)
    assert rows[3].replicas_needed.num_replicas is None


def test_a_lower_bound_is_never_on_the_pareto_front() -> None:
    results = [_result(0, SimConfig(num_replicas=1), 10.0, ttft_p90_ms=500.0),
               _result(1, SimConfig(num_replicas=2), 25.0, ttft_p90_ms=400.0, bound=True)]
    rows = assess(results, {"h200": 3.5}, target_qps=40.0, pareto_key="ttft_p90")
    assert results[1].kind == "lower_bound" and rows[1].cost_per_million_output_tokens_usd is not None
    assert [r.on_pareto_front for r in rows] == [True, False]  # the bound would dominate, but it is no answer
    assert rows[0].replicas_needed.note.endswith("; from capacities that are not all converged answers (lower bound)")
