"""Session 39 (helper D) probes: benchmarks/serving_ceiling.py's trace is an input, as is the model's config.json of
sim.profile; a trace with no rate to rescale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.sim.helpers import write_trace

REPO = Path(__file__).resolve().parents[2]


def _ceiling(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "serving_ceiling.py"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


def test_a_json_onto_the_trace_is_refused_and_the_trace_kept(tmp_path):
    trace = write_trace(tmp_path / "t.parquet", [100] * 20, [4] * 20, [0.1 * i for i in range(20)])
    before = trace.read_bytes()
    done = _ceiling("--trace", str(trace), "--json", str(trace), "--num-requests", "20")
    assert done.returncode == 2
    assert done.stderr == f"error: --json {trace} is one of the inputs ({trace}); write elsewhere\n"
    assert trace.read_bytes() == before  # it was replaced by the figures' JSON


def test_a_trace_whose_requests_all_arrive_at_once_is_one_line(tmp_path):
    # with_qps' ValueError was a traceback at the first probe
    trace = write_trace(tmp_path / "t.parquet", [100] * 20, [4] * 20)
    done = _ceiling("--trace", str(trace), "--num-requests", "20")
    assert done.returncode == 2
    assert done.stderr == (f"error: --trace {trace}: its first 20 request(s) all arrive at once; expected arrival "
                           "times spread in time, whose gaps each probe rescales to its rate\n")


def test_a_profile_onto_the_models_config_is_refused_and_the_config_kept(tmp_path):
    # with --overwrite, sim.profile replaced the model's config.json with the profile after the whole measurement
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    config.write_text((REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json").read_text())
    before = config.read_bytes()
    done = subprocess.run([sys.executable, "-m", "sim.profile", "--model", str(model), "--gpu", "h200", "--out",
                           str(config), "--overwrite"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2
    assert done.stderr == f"error: --out {config} is one of the inputs ({config}); write elsewhere\n"
    assert config.read_bytes() == before
