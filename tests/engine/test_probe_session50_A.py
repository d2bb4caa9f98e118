"""Session 50 (A): device options the host cannot take are refused by engine.replay and engine.serve before the model
loads, naming the option. engine.serve's engine process refused them only while loading, and the line blamed the
model: "error: --model M: ValueError: device='cuda' was asked for but torch sees no CUDA device" and "error: --model M:
ValueError: attention backend 'triton' needs a CUDA device; use 'torch' on cpu"."""

from __future__ import annotations

import importlib.util

import pytest

from cli.engine_replay import main as replay_main
from engine.core.config import ConfigError
from engine.options import EngineOptions
from tests.traces.helpers import cli_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="needs fastapi ('.[serve]')")

NOT_LOADED = "error: --model qwen3-0.6b: stopped before the load"  # what the fixture's engine says: checks passed


def _cuda_devices(monkeypatch, num_devices: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: num_devices > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: num_devices)


def _both_refuse(trace, tmp_path, capsys, args: list[str]) -> str:
    """The one line both tools print for ``args``; nothing is written."""
    from cli.engine_serve import main as serve_main

    replay_args = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--out", str(tmp_path / "out")]
    line = cli_error(replay_main, [*replay_args, *args], capsys)
    assert cli_error(serve_main, ["--port", "0", *args], capsys) == line
    assert not (tmp_path / "out").exists()
    return line


@pytest.mark.parametrize(("num_devices", "device", "seen"), [
    (0, "cuda", "no CUDA device"),
    (0, "cuda:3", "no CUDA device"),
    (1, "cuda:1", "1 CUDA device(s), cuda:0 to cuda:0"),
    (2, "cuda:7", "2 CUDA device(s), cuda:0 to cuda:1"),
])
def test_a_cuda_device_torch_does_not_see_is_refused_naming_device(trace, tmp_path, capsys, monkeypatch, no_load,
                                                                    num_devices, device, seen):
    _cuda_devices(monkeypatch, num_devices)
    assert _both_refuse(trace, tmp_path, capsys, ["--device", device]) == (
        f"error: --device: device={device!r} was asked for but torch sees {seen}")


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_cuda_device_torch_sees_goes_on_to_the_load(trace, tmp_path, capsys, monkeypatch, no_load, device):
    from cli.engine_serve import main as serve_main

    _cuda_devices(monkeypatch, 2)
    assert cli_error(serve_main, ["--port", "0", "--device", device], capsys) == NOT_LOADED


@pytest.mark.parametrize("backend", ["triton", "flash_attn"])
@pytest.mark.parametrize(("device", "which"), [
    (["--device", "cpu"], "device='cpu'"),
    ([], "device='auto' is cpu here (torch sees no CUDA device)"),
])
def test_cuda_attention_kernels_on_the_cpu_are_refused_naming_the_option(trace, tmp_path, capsys, monkeypatch,
                                                                         no_load, backend, device, which):
    _cuda_devices(monkeypatch, 0)
    assert _both_refuse(trace, tmp_path, capsys, [*device, "--attention-backend", backend]) == (
        f"error: --attention-backend: attention_backend {backend!r} needs a CUDA device, and {which}; use 'torch' "
        "(or 'auto') on cpu")


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_the_cpus_attention_backends_go_on_to_the_load(capsys, monkeypatch, no_load, backend):
    from cli.engine_serve import main as serve_main

    _cuda_devices(monkeypatch, 0)
    assert cli_error(serve_main, ["--port", "0", "--device", "cpu", "--attention-backend", backend],
                     capsys) == NOT_LOADED


def test_engine_options_refuse_cuda_kernels_on_the_cpu() -> None:
    """engine.LLM(..., device='cpu', attention_backend='triton') too: the options, before torch loads a model."""
    with pytest.raises(ConfigError, match="^attention_backend 'triton' needs a CUDA device, and device='cpu'"):
        EngineOptions(device="cpu", attention_backend="triton")
    assert EngineOptions(device="cuda", attention_backend="triton").attention_backend == "triton"


@pytest.mark.parametrize(("eos", "why"), [
    ('[1, "a"]', "'eos_token_id' is [1, 'a']; expected a token id or a list of them"),
    ("99999", "'eos_token_id' has 99999, outside the vocabulary [0, 512) (vocab_size); it could never end a "
              "generation"),
])
def test_engine_serve_names_the_generation_config_of_a_bad_eos_before_the_load(tmp_path, capsys, no_load, tiny_qwen3,
                                                                               eos, why):
    """It was "error: --model M: ValueError: M/generation_config.json: ...", from the engine process once torch had
    loaded; now the file's own line, as engine.replay prints it."""
    import shutil

    from cli.engine_serve import main as serve_main

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(f"{tiny_qwen3[0]}/config.json", model_dir)
    (model_dir / "generation_config.json").write_text(f'{{"eos_token_id": {eos}}}')
    assert cli_error(serve_main, ["--port", "0", "--device", "cpu", "--model", str(model_dir)], capsys) == (
        f"error: {model_dir}/generation_config.json: {why}")
    (model_dir / "generation_config.json").write_text('{"eos_token_id": 511}')  # in the vocabulary: on to the load
    assert cli_error(serve_main, ["--port", "0", "--device", "cpu", "--model", str(model_dir)], capsys) == (
        f"error: --model {model_dir}: stopped before the load")
