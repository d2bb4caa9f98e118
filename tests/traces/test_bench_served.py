"""End to end: ``python -m engine.serve`` on a tiny random model (``--load-format dummy``) in a subprocess on a
loopback port, ``python -m traces.bench`` against it, then ``analysis.compare`` beside ``sim.replay`` of the
same trace."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analysis.compare.cli import main as compare_main
from cli.sim_replay import main as sim_main
from cli.traces_bench import main as bench_main
from engine.server import launch
from traces.schema import save_trace

pytest.importorskip("torch")
pytest.importorskip("fastapi")

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 240
TINY_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
              "tie_word_embeddings": True, "eos_token_id": 511, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base URL, model directory) of a server on a 2-layer Qwen3 with random weights, on the CPU."""
    model_dir = tmp_path_factory.mktemp("tiny-config")
    (model_dir / "config.json").write_text(json.dumps(TINY_QWEN3))
    proc, url = launch.start_server(["--model", str(model_dir), "--load-format", "dummy", "--device", "cpu",
                                     "--served-model-name", "tiny"], cwd=REPO, env={"CUDA_VISIBLE_DEVICES": ""},
                                    timeout_s=STARTUP_TIMEOUT_S)
    yield url, model_dir
    launch.stop_server(proc)


def test_bench_against_our_server_then_compare_with_the_simulator(tmp_path, served, capsys) -> None:
    url, model_dir = served
    trace = tmp_path / "trace.parquet"
    outputs = [4, 2, 6, 1]
    save_trace(pl.DataFrame({"request_id": ["a", "b", "c", "d"], "arrival_s": [0.0, 0.1, 0.2, 0.3],
                             "prompt_tokens": [20, 45, 33, 12], "output_tokens": outputs}), trace)
    bench_dir, sim_dir = tmp_path / "served", tmp_path / "sim"
    # --model names the served model; the prompt ids come from the model directory's vocabulary, as sim.replay's.
    assert bench_main([url, str(trace), "--model", "tiny", "--vocab-size", "512", "--out", str(bench_dir),
                       "--quiet", "--no-report"]) == 0
    requests = pl.read_parquet(bench_dir / "requests.parquet")
    assert requests["finish_reason"].to_list() == ["length"] * 4 and requests["error"].null_count() == 4
    assert requests["output_tokens"].to_list() == outputs  # ignore_eos and max_tokens honoured
    assert requests["prompt_tokens"].to_list() == [20, 45, 33, 12]  # the server's usage: the exact lengths
    assert [len(times) for times in requests["token_times_s"].to_list()] == outputs  # one token per chunk
    assert sim_main([str(trace), "--model", str(model_dir), "--out", str(sim_dir), "--quiet", "--no-report"]) == 0
    capsys.readouterr()
    assert compare_main([str(bench_dir), str(sim_dir), "--out", str(tmp_path / "cmp"), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "requests matched on request_id: 4 of 4 real" in printed
    assert "schedule diff: n/a" in printed
