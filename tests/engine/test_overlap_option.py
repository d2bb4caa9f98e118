"""The engine option overlap_decode_attention (decode attention on a second CUDA stream beside prefill attention):
refused in one line where it cannot run, and measurable through benchmarks/serving.py --now-args. On CPU; the GPU
side is tests/engine/test_gpu_overlap.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from engine.core.config import ConfigError
from engine.options import EngineOptions
from tests.traces.helpers import cli_error

REPO = Path(__file__).resolve().parents[2]


def _load(script: str):
    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_off_by_default_and_taken_as_a_plain_bool():
    assert EngineOptions().overlap_decode_attention is False
    assert EngineOptions(overlap_decode_attention=True).overlap_decode_attention is True
    with pytest.raises(ConfigError, match="overlap_decode_attention must be true or false, got 'yes'") as raised:
        EngineOptions(overlap_decode_attention="yes")
    assert raised.value.field == "overlap_decode_attention"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(attention_backend="torch"), "overlap_decode_attention needs attention_backend 'triton' (or 'auto' on a "
                                      "CUDA device), got 'torch'"),
    (dict(attention_backend="flash_attn"), "got 'flash_attn'"),
    (dict(device="cpu"), "overlap_decode_attention needs a CUDA device, and device='cpu'"),
])
def test_refused_where_the_second_stream_would_do_nothing(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as raised:
        EngineOptions(overlap_decode_attention=True, **kwargs)
    assert raised.value.field == "overlap_decode_attention"


def test_engine_replay_names_the_flag_on_the_cpu(tmp_path, capsys):
    from cli.engine_replay import main as replay_main

    trace = REPO / "traces" / "sharegpt.parquet"
    line = cli_error(replay_main, [str(trace), "--device", "cpu", "--overlap-decode-attention", "--out",
                                   str(tmp_path / "out")], capsys)
    assert line == "error: --overlap-decode-attention: overlap_decode_attention needs a CUDA device, and device='cpu'"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("now_args", "line"), [
    ("--bogus 3", "error: --now-args: unrecognized arguments: --bogus 3 (--help lists the options)"),
    ("--max-cuda-graph-tokens x", "error: --now-args: argument --max-cuda-graph-tokens: invalid int value: 'x' "
                                  "(--help lists the options)"),
    ("--qps=3", "error: --now-args: --qps=3 is set by every probe; expected other engine.replay options"),
    ("'--overlap-decode-attention", "error: --now-args: No closing quotation"),
])
def test_serving_benchmark_checks_the_now_engines_options_before_any_gpu_work(capsys, now_args, line):
    serving = _load("benchmarks/serving.py")
    assert cli_error(serving.main, [f"--now-args={now_args}"], capsys) == line


def test_serving_benchmark_passes_the_options_to_the_second_engine_only(monkeypatch, tmp_path):
    serving = _load("benchmarks/serving.py")
    calls = []

    def replay(tree, trace, qps, limit, extra, out, model):
        calls.append((Path(tree), list(extra)))
        return {"qps": round(qps, 3), "wall_s": 0.0, "ttft_ms_p50": 1.0, "ttft_ms_p90": 1.0, "tpot_ms_p50": 1.0,
                "output_throughput": 1.0, "num_finished": limit}

    monkeypatch.setattr(serving, "replay", replay)
    monkeypatch.setattr(serving, "cuda_available", lambda: True)
    trace = REPO / "traces" / "sharegpt.parquet"
    assert serving.main(["--before-tree", str(REPO), "--trace", str(trace), "--probes", "1", "--warmup-requests", "0",
                         "--now-args=--overlap-decode-attention", "--json", str(tmp_path / "r.json")]) == 0
    assert calls == [(REPO, []), (REPO, ["--overlap-decode-attention"])]
