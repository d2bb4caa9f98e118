"""Device and backend options of engine.replay and engine.serve, refused before anything slow (exit 2, one line), and
the note both print when --device auto finds no CUDA device."""

from __future__ import annotations

import importlib.util

import pytest

from cli.engine_replay import main as replay_main
from cli.engine_serve import main as serve_main
from engine.options import EngineOptions
from tests.traces.helpers import cli_error

DEVICE_LINE = ("error: --device: device must be 'auto', 'cuda', 'cuda:N' (N an integer from 0 to 127) or 'cpu', "
               "got {!r}")
NCCL_ON_CPU = ("error: --distributed-backend: distributed_backend 'nccl' needs a CUDA device, and device='cpu'; use "
               "'gloo' (or 'auto') on cpu")
NCCL_ON_AUTO = ("error: --distributed-backend: distributed_backend 'nccl' needs a CUDA device, and device='auto' is "
                "cpu here (torch sees no CUDA device); use 'gloo' (or 'auto') on cpu")
NOTE = ("note: torch sees no CUDA device, so {} runs on the CPU (slow; its step times are the CPU's); pass --device "
        "cpu to choose it without this note, or run on a GPU host")


# engine.serve's half needs the server's extra (a host without it, the GPU machine, is refused for that first).
needs_server = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="needs fastapi ('.[serve]')")


def _replay(trace, tmp_path, *args):
    return [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--out", str(tmp_path / "out"), *args]


# torch's "RuntimeError: Invalid device string" traceback (replay), or "--model ...: RuntimeError" after the engine
# process had started (serve)
@needs_server
@pytest.mark.parametrize("device", ["cuda:x", "cuda:-1", "cuda:0 ", "cuda:1.5", "cuda:00", "cuda:128", "gpu"])
def test_a_malformed_device_is_refused_by_both_tools(trace, tmp_path, capsys, no_load, device):
    line = DEVICE_LINE.format(device)
    assert cli_error(replay_main, _replay(trace, tmp_path, "--device", device), capsys) == line
    assert cli_error(serve_main, ["--port", "0", "--device", device], capsys) == line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7", "cuda:127"])
def test_well_formed_devices_are_accepted(device):
    assert EngineOptions(device=device).device == device


@needs_server
@pytest.mark.parametrize("tp", [[], ["--tensor-parallel-size", "2"]])  # TP 1 ignored it; TP 2 failed in a worker
def test_nccl_on_the_cpu_is_refused_by_both_tools(trace, tmp_path, capsys, no_load, tp):
    args = ["--device", "cpu", "--distributed-backend", "nccl", *tp]
    assert cli_error(replay_main, _replay(trace, tmp_path, *args), capsys) == NCCL_ON_CPU
    assert cli_error(serve_main, ["--port", "0", *args], capsys) == NCCL_ON_CPU


@needs_server
def test_nccl_where_auto_finds_no_gpu_is_refused_by_both_tools(trace, tmp_path, capsys, no_load, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--distributed-backend", "nccl", "--tensor-parallel-size", "2"]
    assert cli_error(replay_main, _replay(trace, tmp_path, *args), capsys) == NCCL_ON_AUTO
    assert cli_error(serve_main, ["--port", "0", *args], capsys) == NCCL_ON_AUTO


def test_nccl_where_auto_finds_no_gpu_is_refused_before_workers_start(monkeypatch):
    """engine.LLM with device 'auto' on a host without CUDA: refused before a worker is spawned."""
    torch = pytest.importorskip("torch")
    import engine.gpu.distributed as distributed
    from engine.llm import LLM

    def no_store():
        raise AssertionError("workers were started")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(distributed, "_open_store", no_store)
    with pytest.raises(ValueError) as info:
        LLM("qwen3-0.6b", load_format="dummy", tensor_parallel_size=2, distributed_backend="nccl")
    assert str(info.value) == NCCL_ON_AUTO.removeprefix("error: --distributed-backend: ")


@needs_server
@pytest.mark.parametrize(("device", "cuda", "noted"), [
    ([], False, True),  # served on the CPU with only "serving on ..."
    (["--device", "cpu"], False, False),
    ([], True, False),
])
def test_engine_serve_says_when_it_falls_back_to_the_cpu(capsys, no_load, monkeypatch, device, cuda, noted):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    with pytest.raises(SystemExit):
        serve_main(["--port", "0", *device])
    lines = capsys.readouterr().err.splitlines()
    assert lines == ([NOTE.format("engine.serve")] if noted else []) + ["error: --model qwen3-0.6b: stopped before "
                                                                         "the load"]


def _has_ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_engine_serve_listens_on_an_ipv6_address_bracketed_or_not(host):
    """``--host [::1]`` (as URLs write the address, and as the server prints it back) was refused: 'Name or service
    not known'."""
    from cli.engine_serve import _bind

    sock = _bind(host, 0)
    try:
        assert sock.getsockname()[0] == "::1"
    finally:
        sock.close()


def test_engine_serve_names_a_malformed_host_as_given():
    from cli.engine_serve import _bind

    with pytest.raises(ValueError, match=r"^--host \[::1 --port 0: cannot listen there"):
        _bind("[::1", 0)
