"""engine.replay end to end on CPU, and the offline fidelity rule: with every request at t=0, the
simulator forms exactly the real engine's batches, step by step."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("polars")

from cli.engine_replay import main as engine_replay  # noqa: E402
from engine.core.records import SCHEDULE_COLUMNS  # noqa: E402
from traces.schema import save_trace  # noqa: E402


@pytest.fixture(scope="module")
def shared_prefix_trace(tmp_path_factory):
    """24 requests; groups of them share 16-token hash blocks so the prefix cache is exercised."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(24):
        prompt = int(torch.randint(20, 200, (1,), generator=g))
        blocks = -(-prompt // 16)
        shared = min(blocks, int(torch.randint(0, 6, (1,), generator=g)))
        hash_ids = [1000 * (i % 3) + b for b in range(shared)] + [100_000 + 100 * i + b for b in range(blocks - shared)]
        rows.append({"request_id": f"r{i}", "arrival_s": 0.05 * i, "prompt_tokens": prompt,
                     "output_tokens": int(torch.randint(2, 40, (1,), generator=g)), "hash_ids": hash_ids})
    path = tmp_path_factory.mktemp("trace") / "shared.parquet"
    save_trace(pl.DataFrame(rows), path, hash_block_size=16)
    return str(path)


COMMON = ["--block-size", "16", "--max-model-len", "512", "--max-num-batched-tokens", "96", "--max-num-seqs", "6",
          "--num-gpu-blocks", "30", "--quiet"]


@pytest.mark.parametrize("policy", ["mixed", "nano"])
def test_offline_simulation_forms_the_real_batches(tiny_qwen3, shared_prefix_trace, tmp_path, policy):
    from cli.sim_replay import main as sim_replay

    model_dir, _ = tiny_qwen3
    options = [shared_prefix_trace, "--model", model_dir, "--offline", "--policy", policy, *COMMON]
    if policy == "nano":
        options[options.index("--max-num-batched-tokens") + 1] = "512"
    assert engine_replay([*options, "--out", str(tmp_path / "real"), "--warmup-requests", "2", "--step-timings"]) == 0
    assert sim_replay([*options, "--out", str(tmp_path / "sim"), "--no-report"]) == 0
    compared = SCHEDULE_COLUMNS + ("prefill_attention_pairs", "max_decode_context_tokens")
    real_steps = pl.read_parquet(tmp_path / "real" / "steps.parquet")
    # --step-timings: every step has its host times (CPU: no GPU times, so zeros; on the device machine, the GPU's)
    assert (real_steps["host_prepare_ms"] > 0).all() and (real_steps["host_launch_ms"] > 0).all()
    gpu_ms = real_steps["gpu_forward_ms"]
    assert ((gpu_ms > 0) if torch.cuda.is_available() else (gpu_ms == 0)).all()
    real_steps = real_steps.select(compared)
    sim_steps = pl.read_parquet(tmp_path / "sim" / "steps.parquet").select(compared)
    assert real_steps.height > 10
    assert real_steps.equals(sim_steps), "the simulated schedule differs from the real one"
    assert real_steps["num_preempted"].sum() > 0, "the cache was meant to be small enough to preempt"
    columns = ["request_id", "prompt_tokens", "output_tokens", "cached_tokens", "num_preemptions", "finish_reason"]
    real_requests = pl.read_parquet(tmp_path / "real" / "requests.parquet").select(columns).sort("request_id")
    sim_requests = pl.read_parquet(tmp_path / "sim" / "requests.parquet").select(columns).sort("request_id")
    assert real_requests.equals(sim_requests)
    assert real_requests["cached_tokens"].sum() > 0
    real = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert real["num_finished"] == 24 and real["config"]["num_gpu_blocks"] == 30 and real["cost_model"] == "measured"
    assert set(real["config"]["host"]) == {"cpu", "num_cpus", "node"}  # what sim.calibrate compares with the profile
    # What ran, not the 'auto' the options left (the tiny model has weights; one process: no collectives).
    ran = {key: real["config"][key] for key in ("device", "dtype", "load_format", "attention_backend",
                                                 "distributed_backend")}
    cuda = torch.cuda.is_available()  # where the engine's 'auto' picks the GPU (on the device machine)
    assert ran == {"device": torch.cuda.get_device_name(0) if cuda else "cpu",
                   "dtype": "bfloat16" if cuda else "float32", "load_format": "safetensors",
                   "attention_backend": "triton" if cuda else "torch", "distributed_backend": None}


def test_online_replay_waits_for_arrivals(tiny_qwen3, shared_prefix_trace, tmp_path):
    model_dir, _ = tiny_qwen3
    out = tmp_path / "online"
    assert engine_replay([shared_prefix_trace, "--model", model_dir, *COMMON, "--out", str(out),
                          "--warmup-requests", "0", "--slo", "e2e_p99=600s"]) == 0
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == 24
    summary = json.loads((out / "summary.json").read_text())  # every request within the SLO: goodput = throughput
    assert summary["request_goodput"] == summary["goodput"] == summary["request_throughput"] > 0
    # No request is scheduled before it arrives, and the last arrival (1.15 s) is respected.
    assert (requests["first_scheduled_s"] >= requests["arrival_s"]).all()
    assert requests["first_scheduled_s"].max() >= 1.15
    assert set(requests["finish_reason"]) == {"length"}


def test_replay_rejects_bad_options_with_a_message(tiny_qwen3, shared_prefix_trace, tmp_path, capsys):
    model_dir, _ = tiny_qwen3
    with pytest.raises(SystemExit) as exit_info:
        engine_replay([shared_prefix_trace, "--model", model_dir, "--block-size", "24", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "block_size must be a power of two" in capsys.readouterr().err


def test_replay_samples_with_the_filters_asked_and_records_them(tiny_qwen3, shared_prefix_trace, tmp_path, capsys):
    """--top-k / --top-p reach every request's SamplingParams and the run's config (only when on: analysis.compare then
    lists them beside a simulation, which prices greedy sampling); the schedule is the simulator's all the same
    (ignore_eos: the trace's output lengths). Bad values are refused before the model loads."""
    from cli.sim_replay import main as sim_replay
    from traces.requests import TraceRequests
    from traces.schema import load_trace

    requests = TraceRequests(load_trace(shared_prefix_trace), 1000, 0, 0.7, 5, 0.9)
    params = requests.sampling_params(3)
    assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (0.7, 5, 0.9,
                                                                                  requests.output_tokens[3])
    model_dir, _ = tiny_qwen3
    options = [shared_prefix_trace, "--model", model_dir, "--offline", *COMMON]
    real = tmp_path / "real"
    assert engine_replay([*options, "--out", str(real), "--warmup-requests", "0", "--temperature", "0.7",
                          "--top-k", "5", "--top-p", "0.9"]) == 0
    config = json.loads((real / "summary.json").read_text())["config"]
    assert (config["temperature"], config["top_k"], config["top_p"]) == (0.7, 5, 0.9)
    assert sim_replay([*options, "--out", str(tmp_path / "sim"), "--no-report"]) == 0
    real_steps = pl.read_parquet(real / "steps.parquet").select(SCHEDULE_COLUMNS)
    assert real_steps.equals(pl.read_parquet(tmp_path / "sim" / "steps.parquet").select(SCHEDULE_COLUMNS))
    plain = tmp_path / "plain"
    assert engine_replay([*options, "--out", str(plain), "--warmup-requests", "0"]) == 0
    assert not {"top_k", "top_p"} & set(json.loads((plain / "summary.json").read_text())["config"])
    for option, value, line in (("--top-k", "-5", "error: --top-k must be -1 or 0 (off) or >= 1, got -5"),
                                ("--top-p", "0", "error: --top-p must be in (0, 1], got 0.0"),
                                ("--top-p", "nan", "error: --top-p must be in (0, 1], got nan")):
        with pytest.raises(SystemExit) as exit_info:
            engine_replay([*options, "--out", str(tmp_path / "bad"), option, value])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == line  # after the earlier runs' CPU notes
        assert not (tmp_path / "bad").exists()
