"""The README's commands on a CPU-only machine (session 30, probe E). Each case failed before."""

from __future__ import annotations

import importlib.util

import pytest

from tests.traces.helpers import REPO_ROOT


def _serving_overhead():
    spec = importlib.util.spec_from_file_location("serving_overhead_probe_e",
                                                  REPO_ROOT / "benchmarks" / "serving_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serving_overhead_without_a_gpu_says_so_instead_of_running_on_the_cpu(tmp_path, monkeypatch, capsys):
    """benchmarks/serving_overhead.py (a GPU benchmark, as its docstring says) ran engine.replay and engine.serve on
    the CPU where torch saw no CUDA GPU: the user saw one "$ python -m engine.replay ..." line and a run of hours
    (the fallback's note went to inproc.log), and its JSON would have held the CPU's latencies. The other GPU
    benchmarks stop with one line; --cpu runs it there anyway, as benchmarks/throughput.py's does."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the benchmark runs on it")
    module = _serving_overhead()

    def ran(*args, **kwargs):
        raise AssertionError("the benchmark started a run without a GPU")

    monkeypatch.setattr(module, "run", ran)
    monkeypatch.setattr(module, "start_server", ran)
    argv = [str(REPO_ROOT / "traces" / "sharegpt.parquet"), "--qps", "1", "--limit", "2", "--out-dir",
            str(tmp_path / "o"), "--json", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: this benchmark times engine.replay and engine.serve on a CUDA GPU and "
                                       "found none; pass --cpu to run them on the CPU anyway (slowly)\n")
    assert list(tmp_path.iterdir()) == []
    # --cpu: the runs start (here, the first one stands in for them)
    with pytest.raises(AssertionError, match="started a run"):
        module.main([*argv, "--cpu"])
