"""A replay whose step log outgrows what its outputs can be written in stops with one line naming the limit, and
leaves no folder: a trace of months (BurstGPT's 1.4M requests make some 400M steps) ran until the kernel's
out-of-memory killer ended it, without a word, its staging folder left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

import cli.sim_replay as sim_replay
from sim.config import SimConfig
from sim.memory import BYTES_PER_STEP_WRITTEN, max_steps_to_write
from sim.simulator import StepLimitError, simulate
from tests.sim.helpers import SHAREGPT
from traces.schema import load_trace


def test_simulate_stops_past_max_steps_and_not_below() -> None:
    trace = load_trace(SHAREGPT).head(300)
    with pytest.raises(StepLimitError, match=r"reached [\d,]+ engine steps .* more than the 1,000 steps"):
        simulate(trace, SimConfig(), max_steps=1000)
    full = simulate(trace, SimConfig())
    num_steps = sum(len(engine.step_log) for engine in full.engines)
    limited = simulate(trace, SimConfig(), max_steps=num_steps)  # exactly its own steps: it runs to its end
    assert limited.requests_table().equals(full.requests_table())


def test_max_steps_follow_the_memory_available() -> None:
    assert max_steps_to_write(None) is None
    assert max_steps_to_write(10 * BYTES_PER_STEP_WRITTEN + 5) == 10
    assert max_steps_to_write(0) == 1


def test_sim_replay_says_so_in_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    # Memory for the 300 requests' rows and tokens (traces.requests.check_run_memory: ~2.6 MB), not for their ~29,500
    # steps.
    monkeypatch.setattr(sim_replay, "host_memory_available", lambda: 10_000 * BYTES_PER_STEP_WRITTEN)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        sim_replay.main([str(SHAREGPT), "--limit", "300", "--quiet", "--out", str(out)])
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("error: the simulation reached ") and "more than the 10,000 steps" in line
    assert line.endswith(f"nothing written to {out}")
    assert not out.exists() and list(tmp_path.iterdir()) == []
