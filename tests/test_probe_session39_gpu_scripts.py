"""Session 39: the GPU-only benchmarks (kernels, step, prefill variants, cuDNN prefill, decode splits) refuse a --json
path that cannot take their results before any GPU work, in one line with status 2 (they checked nothing and met
it after the whole run: a folder was an IsADirectoryError traceback), and write it whole (renamed into place)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = ("kernels", "step", "prefill_variants", "cudnn_prefill", "decode_splits")


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_for_json_is_refused_before_any_gpu_work(script, tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    for given, expected in ((f"{folder}/", f"error: --json {folder}/ ends with '/', a folder; expected a file path"),
                            (str(folder), f"error: --json {folder} is a directory; expected a file path")):
        done = _run(script, "--json", given)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), done.stderr
        assert "CUDA" not in done.stderr  # refused before the GPU check, which a CPU machine would meet first
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_file_path_passes_the_check_and_meets_the_gpu_check_on_a_cpu(script, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("runs the benchmark on a GPU")
    out = tmp_path / "results.json"
    done = _run(script, "--json", str(out))
    assert done.returncode == 2, done.stderr
    assert "CUDA" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not out.exists()
