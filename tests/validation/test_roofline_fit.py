"""validation/roofline_fit.py refuses bad input in one line before its fit (a missing --real folder was a traceback
after some two minutes of fitting, and --json naming a run's summary.json replaced that input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "validation" / "roofline_fit.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def _gpu_run(folder: Path, trace: str = "traces/sharegpt.parquet") -> Path:
    folder.mkdir()
    latencies = {f"{metric}_ms": {"p50": 1.0, "p90": 2.0} for metric in ("ttft", "tpot", "e2e")}
    config = {"trace": trace, "model": "llama-3.1-8b", "max_model_len": 16384, "num_gpu_blocks": 100,
              "block_size": 256, "max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_prefix_caching": True,
              "policy": "mixed", "qps": 4.0, "limit": 10}
    (folder / "summary.json").write_text(json.dumps({"config": config, **latencies}))
    return folder


def test_a_folder_without_summary_is_one_line(tmp_path: Path) -> None:
    result = _run("--real", str(tmp_path / "missing"))
    assert result.returncode == 2 and result.stderr == (
        f"error: --real {tmp_path / 'missing'}: no readable summary.json (FileNotFoundError); expected an "
        "engine.replay run folder\n")


def test_json_naming_a_runs_summary_is_refused_and_the_input_kept(tmp_path: Path) -> None:
    run = _gpu_run(tmp_path / "run")
    before = (run / "summary.json").read_bytes()
    result = _run("--real", str(run), "--json", str(run / "summary.json"))
    assert result.returncode == 2 and result.stderr.startswith(f"error: --json {run / 'summary.json'} is one of the "
                                                               "inputs")
    assert (run / "summary.json").read_bytes() == before


def test_a_run_whose_trace_is_gone_and_bad_options(tmp_path: Path) -> None:
    run = _gpu_run(tmp_path / "run", trace=str(tmp_path / "gone.parquet"))
    result = _run("--real", str(run))
    assert result.returncode == 2 and result.stderr == (f"error: --real {run}: its trace {tmp_path / 'gone.parquet'} "
                                                        "does not exist (python validation/make_traces.py makes the "
                                                        "slices)\n")
    for args, message in ((["--qps", "nan"], "error: --qps must be a finite number > 0, got nan\n"),
                          (["--trace", str(tmp_path / "none.parquet")],
                           f"error: --trace {tmp_path / 'none.parquet'} does not exist\n")):
        result = _run(*args)
        assert result.returncode == 2 and result.stderr == message
