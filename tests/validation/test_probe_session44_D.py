"""Session 44 (helper D): validation/tp_nccl/tp_hang_probe.py, a GPU diagnostic, met a bad option (a missing model, a
negative length, an unknown device) as a traceback of 15-25 lines from inside engine.LLM at exit 1; it is now the
engine's own one-line refusal, exit 2, before any worker starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE_MARK = "[probe "  # the diagnostic's own phase lines on stderr, by design


@pytest.mark.parametrize("argv, line", [
    (["--model", ""], "error: model is empty; expected a shipped model config name or a Hugging Face model folder, "
                      "got ''"),
    (["--max-model-len", "-1"], "error: max_model_len must be an integer >= 1, got -1"),
    (["--device", "tpu"], "error: device must be 'auto', 'cuda', 'cuda:N' (N an integer from 0 to 127) or 'cpu', "
                          "got 'tpu'"),
])
def test_tp_hang_probe_refuses_a_bad_option_in_one_line(tmp_path: Path, argv: list[str], line: str) -> None:
    pytest.importorskip("torch")  # the probe imports it before it parses its options
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROBE_STACK_DIR": str(tmp_path / "stacks")}
    done = subprocess.run([sys.executable, "validation/tp_nccl/tp_hang_probe.py", *argv], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert done.returncode == 2
    assert [text for text in done.stderr.splitlines() if not text.startswith(PROBE_MARK)] == [line]
