"""Bad options to ``python -m engine.replay`` fail before the model loads: exit 2, one line, nothing written."""

from __future__ import annotations

import polars as pl
import pytest

from cli.engine_replay import main as replay_main
from tests.traces.helpers import cli_error


@pytest.mark.parametrize(("args", "pattern"), [
    (["--temperature", "nan"], "--temperature"),  # failed only after the model had loaded
    (["--temperature", "-1"], "--temperature"),
    # SamplingParams' bound (float32 logits / 1e308 are 0): refused as 'SamplingParams.temperature' after the load
    (["--temperature", "1e308"], "error: --temperature must be a number from 0 to 3.4e+38, got 1e+308"),
    (["--warmup-requests", "-1"], "--warmup-requests"),  # silently no warm-up
    (["--warmup-requests", str(2**70)], "--warmup-requests"),  # hung building the warm-up prompts
    (["--time-scale", "1e308"], "stretches the last arrival to 1e+308 s"),  # OverflowError in time.sleep
    (["--time-scale", "1e9"], "real-time replay is limited"),  # a trace bound allows it; real time does not
    (["--qps", "1e-320"], "too small"),
    (["--slo", "ttft_p90=fast"], "--slo: cannot parse SLO 'ttft_p90=fast'"),
    (["--num-gpu-blocks", str(2**70)], "below 2**31 (block ids are int32"),  # a torch TypeError traceback
    # an OverflowError traceback from the rotary table's torch.arange, after the weights had been made
    (["--max-model-len", str(10**20), "--allow-long-max-model-len"],
     "error: --max-model-len: max_model_len must be below 2**31 (token offsets and lengths are int32 in the engine), "
     "got 100000000000000000000"),
    (["--max-num-seqs", str(2**31)], "error: --max-num-seqs: max_num_seqs must be below 2**31"),
    (["--model", ""], "error: --model: model is empty"),  # was "model directory . has no config.json"
])
def test_engine_replay_refuses_before_loading(trace, tmp_path, capsys, args, pattern):
    out = tmp_path / "out"
    base = ["--model", "qwen3-0.6b"] if "--model" not in args else []  # an option is given once
    argv = [str(trace), *base, "--load-format", "dummy", "--device", "cpu", "--out", str(out), *args]
    assert pattern in cli_error(replay_main, argv, capsys)
    assert not out.exists()


def test_engine_replay_refuses_a_trace_that_starts_in_the_far_future(tmp_path, capsys):
    """Unix timestamps as arrival_s: the replay's clock starts at 0 s and idled 54 years before the first request."""
    path = tmp_path / "unix.parquet"
    pl.DataFrame({"request_id": [0, 1], "arrival_s": [1.7e9, 1.7e9 + 1.0], "prompt_tokens": [3, 4],
                  "output_tokens": [1, 1]}).write_parquet(path)
    out = tmp_path / "out"
    argv = [str(path), "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--out", str(out)]
    assert "the first request arrives at 1.7e+09 s" in cli_error(replay_main, argv, capsys)
    assert not out.exists()


def test_engine_replay_checks_prompt_ids_against_the_vocabulary_before_loading(tmp_path, capsys, monkeypatch):
    """A stored id beyond the model's vocabulary failed only when its row arrived, after the model had loaded."""
    import engine.llm

    monkeypatch.setattr(engine.llm, "LLM", lambda *a, **k: pytest.fail("the model loaded before the check"))
    trace = tmp_path / "ids.parquet"
    pl.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [2], "output_tokens": [1],
                  "prompt_token_ids": [[5, 151936]]}).write_parquet(trace)
    out = tmp_path / "out"
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--out", str(out)]
    line = cli_error(replay_main, argv, capsys)
    assert f"{trace}: row 0" in line and "token id 151936 at position 1, outside the vocabulary" in line
    assert not out.exists()


def test_engine_replay_options_beyond_memory_are_one_line(trace, tmp_path, capsys, monkeypatch):
    """--num-gpu-blocks 2**30 on a CPU: torch's allocation error, a RuntimeError traceback of 35 lines."""
    import engine.llm

    def cannot_allocate(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you "
                           "tried to allocate 63050394783186944 bytes.")

    monkeypatch.setattr(engine.llm, "LLM", cannot_allocate)
    out = tmp_path / "out"
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--out", str(out),
            "--num-gpu-blocks", str(2**30)]
    line = cli_error(replay_main, argv, capsys)
    assert line.startswith("error: qwen3-0.6b does not fit in memory with these options ([enforce fail")
    assert line.endswith("lower --max-num-seqs, --num-gpu-blocks, --max-num-batched-tokens or "
                         "--gpu-memory-utilization")
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]


def test_engine_replay_ends_when_the_last_requests_are_rejected(tiny_qwen3, tmp_path):
    """Every request longer than --max-model-len: the loop slept until arrivals[len], an IndexError traceback."""
    pytest.importorskip("torch")
    model_dir, _ = tiny_qwen3
    trace = tmp_path / "long.parquet"
    pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.01, 0.02], "prompt_tokens": [3, 40, 50],
                  "output_tokens": [1, 1, 1]}).write_parquet(trace)
    out = tmp_path / "out"
    argv = [str(trace), "--model", model_dir, "--device", "cpu", "--max-model-len", "32", "--block-size", "16",
            "--warmup-requests", "0", "--no-report", "--quiet", "--out", str(out)]
    assert replay_main(argv) == 0
    reasons = pl.read_parquet(out / "requests.parquet").sort("request_id")["finish_reason"].to_list()
    assert reasons == ["length", "rejected", "rejected"]


def test_engine_replay_refuses_weights_beyond_host_memory_before_loading(trace, tmp_path, capsys, monkeypatch):
    """qwen3-8b on a 23 GiB CPU host: the kernel killed the load (exit 137, no message, a .partial folder left)."""
    pytest.importorskip("torch")
    import engine.llm

    monkeypatch.setattr(engine.llm, "host_memory_available", lambda: 1 << 30)
    out = tmp_path / "out"
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--out", str(out)]
    line = cli_error(replay_main, argv, capsys)
    assert line.startswith("error: qwen3-0.6b: its float32 weights need ") and "1.0 GiB is available" in line
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]


def test_engine_replay_refuses_rotary_tables_beyond_host_memory_before_loading(trace, tmp_path, capsys, monkeypatch):
    """--max-model-len 3e9 with --allow-long-max-model-len: each layer's rotary table for every position took hundreds
    of GiB, and the kernel killed the process (exit 137, no message)."""
    pytest.importorskip("torch")
    import engine.llm

    monkeypatch.setattr(engine.llm, "host_memory_available", lambda: 8 << 30)
    out = tmp_path / "out"
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu", "--out", str(out),
            "--max-model-len", str(10**8), "--allow-long-max-model-len"]
    line = cli_error(replay_main, argv, capsys)
    assert line == ("error: max_model_len=100000000: qwen3-0.6b's rotary tables for that many positions need 143.1 "
                    "GiB of host memory besides 2.2 GiB of weights, and 8.0 GiB is available; lower --max-model-len")
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]


@pytest.mark.parametrize(("device", "cuda", "noted"), [
    ([], False, True),  # ran on the CPU for minutes without a word
    (["--device", "cpu"], False, False),  # asked for: no note
    ([], True, False),  # auto finds the GPU
])
def test_engine_replay_says_when_it_falls_back_to_the_cpu(trace, tmp_path, capsys, monkeypatch, device, cuda, noted):
    torch = pytest.importorskip("torch")
    import engine.llm

    def stop(*args, **kwargs):
        raise ValueError("stopped before the load")

    monkeypatch.setattr(engine.llm, "LLM", stop)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", *device, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        replay_main(argv)
    lines = capsys.readouterr().err.splitlines()
    note = ("note: torch sees no CUDA device, so engine.replay runs on the CPU (slow; its step times are the CPU's); "
            "pass --device cpu to choose it without this note, or run on a GPU host")
    assert lines == ([note] if noted else []) + ["error: stopped before the load"]


def test_engine_replay_refuses_a_bad_out_before_its_cpu_note(trace, tmp_path, capsys, monkeypatch):
    """Forty-ninth session: a refused --out came after the note on the CPU fallback, two lines for one error."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("kept")
    argv = [str(trace), "--model", "qwen3-0.6b", "--load-format", "dummy", "--out", str(out)]
    assert cli_error(replay_main, argv, capsys) == (f"error: --out {out} exists and is not empty; pass --overwrite to "
                                                    "replace it")
    assert (out / "mine.txt").read_text() == "kept"
