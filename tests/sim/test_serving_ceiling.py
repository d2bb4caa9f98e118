"""The roofline model's overlapped pricing and benchmarks/serving_ceiling.py, which bounds serving capacity with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim.config import SimConfig
from sim.cost_model import RooflineConstants, RooflineCostModel
from sim.hardware import GPUSpec

REPO = Path(__file__).resolve().parents[2]
# Round rates, every efficiency 1 and no host time: each part of a step is its FLOPs or bytes over one rate.
GPU = GPUSpec("test", 80 << 30, datasheet_bandwidth_bps=1e12, datasheet_bf16_flops=1e15)
IDEAL = {"matmul_efficiency": 1.0, "weight_bandwidth_efficiency": 1.0, "kv_bandwidth_efficiency": 1.0,
         "attention_flops_efficiency": 1.0, "step_overhead_s": 0.0, "continuing_step_overhead_s": 0.0,
         "per_seq_overhead_s": 0.0,
         "per_layer_overhead_s": 0.0}


def _batch(num_prefill_tokens: int, num_decode: int, context: int | np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(num_prefill_tokens=num_prefill_tokens, num_prefill_seqs=1 if num_prefill_tokens else 0,
                           num_decode_seqs=num_decode, prefill_context_tokens=0,
                           prefill_attention_pairs=num_prefill_tokens * (num_prefill_tokens + 1) // 2,
                           decode_context_tokens=num_decode * context,
                           seqs=[None] * (num_decode + (1 if num_prefill_tokens else 0)), continues_batch=0)


def _parts(shape, batch) -> tuple[float, float, float, float]:
    """(matmul, weights, prefill attention FLOPs, KV reads) in seconds, written out from the model's shape."""
    tokens = batch.num_prefill_tokens + batch.num_decode_seqs
    sampled = batch.num_decode_seqs + batch.num_prefill_seqs
    matmul = (tokens * 2.0 * shape.num_layers * shape.num_layer_params
              + sampled * 2.0 * shape.hidden_size * shape.vocab_size) / 1e15
    weights = shape.weight_bytes(2, 1) / 1e12
    attention = batch.prefill_attention_pairs * 4.0 * shape.num_layers * shape.num_heads * shape.head_dim / 1e15
    kv = (batch.num_prefill_tokens + batch.decode_context_tokens) * shape.kv_bytes_per_token(2, 1) / 1e12
    return matmul, weights, attention, kv


@pytest.mark.parametrize("num_prefill_tokens, num_decode", [(2048, 80), (0, 64), (8192, 0)])
def test_overlap_prices_the_larger_of_flop_time_and_byte_time(num_prefill_tokens, num_decode):
    shape = SimConfig().model_shape
    batch = _batch(num_prefill_tokens, num_decode, 1500)
    matmul, weights, attention, kv = _parts(shape, batch)
    in_sequence = RooflineCostModel(shape, GPU, constants=RooflineConstants(**IDEAL)).step_time_s(batch)
    overlapped = RooflineCostModel(shape, GPU, constants=RooflineConstants(**IDEAL, overlap_compute_and_memory=True))
    assert in_sequence == pytest.approx(max(matmul, weights) + attention + kv, rel=1e-12)
    assert overlapped.step_time_s(batch) == pytest.approx(max(matmul + attention, weights + kv), rel=1e-12)
    # equal where the step is memory-bound with nothing to hide (decode alone: weights and KV both bytes)
    assert overlapped.step_time_s(batch) < in_sequence if num_prefill_tokens else overlapped.step_time_s(
        batch) == pytest.approx(in_sequence, rel=1e-12)


def test_overlapped_decode_runs_price_each_step_as_one_step():
    """Over a quiet run the contexts are arrays: np.maximum prices each step as the scalar call would."""
    shape = SimConfig().model_shape
    model = RooflineCostModel(shape, GPU, constants=RooflineConstants(**IDEAL, overlap_compute_and_memory=True))
    # 16 rows from a short context, where weights outweigh KV, to a long one, where KV does
    contexts = np.array([1, 100, 1_000, 10_000, 100_000])
    run = model.decode_run_s(_batch(0, 16, contexts))
    assert list(run) == [model.step_time_s(_batch(0, 16, int(c))) for c in contexts]
    weights_bound = shape.weight_bytes(2, 1) / 1e12
    assert run[0] == pytest.approx(weights_bound + 16 * shape.kv_bytes_per_token(2, 1) / 1e12, rel=1e-12)


def test_default_pricing_unchanged_by_the_option():
    """The shipped roofline's prices: host, then the larger of matmul and weights, then attention, as always."""
    shape = SimConfig().model_shape
    constants = RooflineConstants()
    model = RooflineCostModel(shape, GPU, constants=constants)
    batch = _batch(1024, 32, 700)
    matmul, weights, attention, kv = _parts(shape, batch)
    host = constants.step_overhead_s + constants.per_layer_overhead_s * shape.num_layers \
        + constants.per_seq_overhead_s * 33
    expected = host + max(matmul / constants.matmul_efficiency, weights / constants.weight_bandwidth_efficiency) \
        + attention / constants.attention_flops_efficiency + kv / constants.kv_bandwidth_efficiency
    assert model.step_time_s(batch) == pytest.approx(expected, rel=1e-12)


def _ceiling(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "serving_ceiling.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.mark.parametrize("trace", [None, "traces/sharegpt.parquet"])
def test_ceiling_orders_the_models_and_writes_its_figures(tmp_path, trace):
    out = tmp_path / "ceiling.json"
    done = _ceiling("--num-requests", "600", "--json", str(out), *(["--trace", trace] if trace else []))
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())
    models = figures["models"]
    assert list(models) == ["profile", "kernels-in-sequence", "compute-memory-overlapped"]
    met = [models[name]["met_qps"] for name in models]
    assert met[0] < met[1] < met[2]  # the measured engine, then kernels at the stated rates, then overlapped
    gap = figures["full_mixed_steps_at_profile_capacity"]
    assert gap["num_steps"] > 0 and gap["min_batched_tokens"] == 7782  # 95 % of the 8,192-token budget
    assert gap["mean_ideal_ms"] < gap["mean_measured_ms"]  # the measured steps pay what the ideal leaves out
    for found in models.values():
        assert found["met_qps"] < found["missed_qps"] <= found["met_qps"] * 1.005 + 0.01
        assert found["ratio_to_before"] == round(found["met_qps"] / figures["before_qps"], 3)
        assert 0 < found["busy_fraction"] <= 1.0001
        # every probe at or below the met rate met the limit, every one at or above the missed rate missed it
        for probe in found["probes"]:
            if probe["qps"] <= found["met_qps"]:
                assert probe["ttft_ms_p90"] <= figures["ttft_p90_ms_limit"]
            if probe["qps"] >= found["missed_qps"]:
                assert probe["ttft_ms_p90"] is None or probe["ttft_ms_p90"] > figures["ttft_p90_ms_limit"]


@pytest.mark.parametrize("args, names", [(["--gpu", "b200"], "--gpu"), (["--num-requests", "5"], "--num-requests"),
                                         (["--attention-tflops", "nan"], "--attention-tflops"),
                                         (["--json", "/nonexistent-dir/x.json"], "--json"),
                                         (["--trace", "/nonexistent-dir/t.parquet"], "--trace"),
                                         (["--trace", "README.md"], "--trace")])
def test_bad_options_get_one_line(args, names):
    done = _ceiling(*args)
    assert done.returncode == 2
    assert names in done.stderr and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("limit_ms, says", [("1e-9", "missed even at"), ("1e12", "held with every request")])
def test_limits_no_rate_can_decide_are_said_so(tmp_path, limit_ms, says):
    """A limit no single request meets, or one every request meets arriving at once: no rate, a note saying why."""
    out = tmp_path / "ceiling.json"
    done = _ceiling("--num-requests", "50", "--ttft-p90-ms", limit_ms, "--json", str(out))
    assert done.returncode == 0, done.stderr
    models = json.loads(out.read_text())["models"]
    assert len(models) == 3 and all(m["met_qps"] is None and says in m["note"] for m in models.values())
    assert done.stdout.count(says) == 3
