"""Session 24, probe H: hostile input to sim.replay and analysis.capacity that failed with a traceback mid-run
instead of one line naming the option or file (exit 2) before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.sim_replay import main as replay_main
from sim.profiled_cost_model import find_profile
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")


@pytest.mark.parametrize("spec", ["episodes:1,2,0.1,1e308", "episodes:1,2,1e-320,5"])
def test_episodes_whose_normal_periods_overflow_are_refused(tmp_path, capsys, spec):
    """MEAN_S * (1 - FRACTION) / FRACTION, the normal periods' mean, overflowed to inf: the first draw was a
    ZeroDivisionError traceback from inside the simulation (exit 1), in sim.replay and analysis.capacity alike."""
    out = tmp_path / "run"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "5", "--host-slowdown", spec, "--out", str(out),
                                   "--quiet", "--no-report"], capsys)
    assert line.startswith(f"error: --host-slowdown '{spec}': FRACTION ") and "overflow" in line, line
    assert not out.exists()


def test_episodes_of_a_long_mean_that_fits_a_float_still_run(tmp_path, capsys):
    """The check refuses only an overflow: the same MEAN_S at FRACTION 0.5 (normal mean = MEAN_S) replays."""
    out = tmp_path / "run"
    assert replay_main([str(SHAREGPT), "--limit", "5", "--host-slowdown", "episodes:1,2,0.5,1e308", "--out",
                        str(out), "--quiet", "--no-report"]) == 0
    assert (out / "summary.json").is_file()


def test_profile_slow_share_below_a_billionth_is_refused_before_band_replays(tmp_path, capsys):
    """A profile's serving.host_episodes.slow_share_range of [1e-320, 1e-320] passed the profile's checks, and every
    --bands replay then failed with a traceback (the drawn share made the normal periods' mean inf)."""
    data = json.loads(PROFILE.read_text())
    for block in (data["serving"], data["fit"]["serving"]):
        block["host_episodes"]["slow_share_range"] = [1e-320, 1e-320]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "run"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "5", "--cost-model", str(path), "--bands", "2",
                                   "--out", str(out), "--quiet", "--no-report"], capsys)
    assert "slow_share_range" in line and "expected shares of 0 or from 1e-09" in line, line
    assert not out.exists()


def test_an_episodes_seed_beyond_its_bound_names_the_bound(tmp_path, capsys):
    """SEED 2**62 was refused as not 'an integer >= 0', which it is: the message did not say the bound it broke."""
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "5", "--host-slowdown", f"episodes:1,2,0.1,5,{2**62}",
                                   "--out", str(tmp_path / "run"), "--quiet", "--no-report"], capsys)
    assert line.endswith("optionally ,SEED (an integer from 0 to 2**62 - 1)"), line


SCRIPT_CASES = [  # (script and arguments, what the one error line says); each was a traceback (exit 1) or a hang
    (["benchmarks/sim_million.py", "--requests", "99999999999999"], "--requests must be at most 10,000,000"),
    (["benchmarks/sim_million.py", "--requests", "10", "--replicas", "100000"],
     "--replicas: num_replicas must be at most 10,000, got 100000"),
    (["benchmarks/sim_million.py", "--requests", "10", "--replicas", "1", "--qps-per-replica", "1e-300"],
     "--qps-per-replica 1e-300: sim_million synthetic sessions"),
    (["benchmarks/sim_instructions.py", "--sessions", "--limit", "99999999999999"],
     "--limit with --sessions must be at most 10,000,000"),
    # Not a traceback, but a line quoting only valgrind's instruction count, from the child's ConfigError.
    (["benchmarks/sim_instructions.py", "--trace", str(SHAREGPT), "--limit", "5", "--replicas", "100000"],
     "--replicas must be from 1 to 10,000, got 100000"),
    (["benchmarks/bench_client.py", str(SHAREGPT), "--limit", "3", "--repeats", "1", "--itl-ms", "1e308"],
     "--itl-ms a number from 0 to 1000"),
]


@pytest.mark.parametrize(("argv", "message"), SCRIPT_CASES, ids=[" ".join(a[:3]) for a, _ in SCRIPT_CASES])
def test_benchmark_scripts_refuse_arguments_they_cannot_run(tmp_path, argv, message):
    """sim_million: a MemoryError, a ConfigError or a TraceError traceback (the last two after drawing the sessions);
    bench_client --itl-ms 1e308: a fake server sleeping 1e305 s between chunks, the benchmark waiting for ever."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / argv[0]), *argv[1:]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written
