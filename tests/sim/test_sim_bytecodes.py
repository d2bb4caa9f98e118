"""benchmarks/sim_bytecodes.py counts the bytecodes a small replay executes, per file and function, the same on
every run (a count, not a timing), and its JSON adds up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import sim_bytecodes

REPO = Path(__file__).resolve().parents[2]


def _counts(tmp_path: Path, name: str) -> dict:
    out = tmp_path / name
    assert sim_bytecodes.main(["--trace", str(REPO / "traces" / "sharegpt.parquet"), "--limit", "12", "--top", "3",
                               "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_counts_add_up_and_repeat_exactly(tmp_path, capsys):
    first = _counts(tmp_path, "a.json")
    second = _counts(tmp_path, "b.json")
    assert first["num_requests"] == 12
    assert first["bytecodes"] > 0
    assert sum(first["by_file"].values()) == first["bytecodes"]
    assert sum(row["bytecodes"] for row in first["by_function"]) == first["bytecodes"]
    assert first["bytecodes_per_request"] == round(first["bytecodes"] / 12, 1)
    # The shared scheduler's and the simulator's own work are both counted.
    assert first["by_file"]["scheduler.py"] > 0 and first["by_file"]["simulator.py"] > 0
    assert first["bytecodes"] == second["bytecodes"]  # deterministic: what makes it a before/after measure
    assert "by function, top 3" in capsys.readouterr().out


def test_a_fleet_of_sessions_is_counted_with_its_router(tmp_path):
    out = tmp_path / "fleet.json"
    assert sim_bytecodes.main(["--sessions", "--limit", "30", "--replicas", "4", "--router", "prefix", "--top", "3",
                               "--json", str(out)]) == 0
    counts = json.loads(out.read_text())
    assert (counts["trace"], counts["num_requests"], counts["replicas"], counts["router"]) == (
        "benchmarks/sim_million.py sessions", 30, 4, "prefix")
    # The prefix router reads the replicas at every arrival: its work and the lazy windows' are counted.
    assert counts["by_file"]["router.py"] > 0 and counts["by_file"]["quiet_window.py"] > 0
    assert sum(counts["by_file"].values()) == counts["bytecodes"]


def test_sessions_with_a_trace_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        sim_bytecodes.main(["--sessions", "--trace", str(REPO / "traces" / "sharegpt.parquet")])
    assert exit_info.value.code == 2
    assert "--sessions replaces --trace" in capsys.readouterr().err
