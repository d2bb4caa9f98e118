"""Hostile model folders (probe H, session 26): what the probe found and what is now refused.

- A checkpoint without one part of a fused parameter (k_proj of qkv_proj, up_proj of gate_up_proj, a Qwen2 v_proj
  bias) loaded: the fused parameter counted as loaded once any part was, so the rest stayed uninitialised memory and
  the model generated other tokens (a Qwen2 without one v bias: [151, 151, 151, 151]), without a word.
- config.json, generation_config.json or model.safetensors.index.json nested thousands deep was a RecursionError
  traceback (exit 1 from engine.replay, engine.serve and sim.replay); an integer of 5000 digits in one was Python's
  "Exceeds the limit (4300 digits) ... use sys.set_int_max_str_digits()" naming no file; and any size was read
  whole (1 GB of brackets took 2.2 GB of memory before JSON refused it, a sparse 100 GB file all of that).
- A FIFO named *.safetensors in the model folder blocked the load forever (safe_open waits for a writer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from cli.engine_replay import main as replay_main  # noqa: E402
from engine import LLM  # noqa: E402
from engine.core.model_config import ModelShape  # noqa: E402
from tests.engine.test_model_folders import _refusal, _variant  # noqa: E402
from tests.traces.helpers import cli_error  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("fixture_name", "tensor"), [
    ("tiny_qwen3", "model.layers.0.self_attn.k_proj.weight"),
    ("tiny_qwen3", "model.layers.1.self_attn.q_proj.weight"),
    ("tiny_qwen3", "model.layers.0.mlp.up_proj.weight"),
    ("tiny_qwen2", "model.layers.1.self_attn.v_proj.bias"),
])
def test_a_missing_part_of_a_fused_parameter_is_refused(request, tmp_path, fixture_name, tensor):
    model_dir = _variant(request.getfixturevalue(fixture_name)[0], tmp_path / "m", tensors={tensor: None})
    message = _refusal(model_dir)
    assert message == f"{model_dir}: checkpoint lacks 1 parameters, e.g. [{tensor!r}]", message


@pytest.mark.parametrize(("text", "why"), [
    (DEEP, "not valid JSON (arrays or objects nested too deeply)"),
    ('{"vocab_size": ' + "9" * 5000 + "}", "not valid JSON (a number of more than 4300 digits)"),
], ids=["nested", "5000 digits"])
def test_a_config_json_nested_too_deeply_or_with_a_huge_number_names_the_file(tmp_path, capsys, trace, text, why):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError) as info:
        ModelShape.load(tmp_path)
    assert str(info.value) == f"{tmp_path / 'config.json'}: {why}"
    argv = [str(trace), "--model", str(tmp_path), "--device", "cpu", "--out", str(tmp_path / "out")]
    assert cli_error(replay_main, argv, capsys) == f"error: {tmp_path / 'config.json'}: {why}"


@pytest.mark.parametrize("name", ["generation_config.json", "model.safetensors.index.json"])
def test_the_other_json_files_of_a_model_folder_nested_too_deeply_are_named(tiny_qwen3, tmp_path, name):
    model_dir = _variant(tiny_qwen3[0], tmp_path / "m")
    (tmp_path / "m" / name).write_text('{"weight_map": ' + DEEP + "}")
    assert _refusal(model_dir) == f"{tmp_path / 'm' / name}: not valid JSON (arrays or objects nested too deeply)"


def test_a_config_json_too_large_to_be_one_is_refused_unread(tmp_path):
    path = tmp_path / "config.json"
    with open(path, "wb") as f:  # sparse: no disk, and reading it whole took 100 GB of memory
        f.truncate(100 * 2**30)
    with pytest.raises(ValueError) as info:
        ModelShape.load(tmp_path)
    assert str(info.value) == f"{path}: 107,374,182,400 bytes; expected a JSON file of at most 64 MiB"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_named_safetensors_is_refused_not_waited_on(tiny_qwen3, tmp_path, trace):
    """In a process of its own: safe_open blocks in the open call without releasing the GIL, so no thread of the test
    could wait on it with a time limit."""
    model_dir = _variant(tiny_qwen3[0], tmp_path / "m")
    fifo = tmp_path / "m" / "extra.safetensors"
    os.mkfifo(fifo)
    argv = [sys.executable, "-m", "engine.replay", str(trace), "--model", model_dir, "--device", "cpu", "--out",
            str(tmp_path / "out")]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("engine.replay waited on a FIFO named extra.safetensors")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {fifo}: is not a regular file (a folder, FIFO or device); expected a safetensors file"]


def test_a_folder_named_safetensors_is_named_as_not_a_file(tiny_qwen3, tmp_path):
    """It was "not a readable safetensors file (No such device (os error 19))"."""
    model_dir = _variant(tiny_qwen3[0], tmp_path / "m")
    (tmp_path / "m" / "x.safetensors").mkdir()
    assert _refusal(model_dir) == (f"{tmp_path / 'm' / 'x.safetensors'}: is not a regular file (a folder, FIFO or "
                                   "device); expected a safetensors file")


def test_a_whole_checkpoint_still_loads(tiny_qwen2, tmp_path):
    """The count by checkpoint tensor keeps a tied model's skipped lm_head and an untied one's own head loading."""
    model_dir = _variant(tiny_qwen2[0], tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["tie_word_embeddings"] is False
    LLM(model_dir, device="cpu", max_model_len=128)
