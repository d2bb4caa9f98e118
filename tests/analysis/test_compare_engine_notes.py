"""analysis.compare says where the real engine ran otherwise than the engine its simulation's profile measured
(run-ahead, the decode-attention overlap): the errors are then another engine's, not the simulator's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.compare.comparison import config_differences, engine_notes
from tests.analysis.test_compare import real_requests, real_steps, sim_requests, sim_steps, write_run
from tests.analysis.test_compare_cli import run_cli

FEATURES = {"prepares_decode_ahead": True, "runs_decode_ahead": True, "sampler": "gumbel one pass"}
OVERLAP_LONG = ("the real engine ran with overlap_decode_attention and the profile's engine without: its mixed steps "
                "(decode rows beside prefill chunks) are priced long (on an H100 an engine with it served 4-9 % more "
                "than a profile without it put its knee at)")


@pytest.mark.parametrize(("real", "features", "expected"), [
    ({"overlap_decode_attention": False, "run_ahead": True}, FEATURES, []),  # the shipped profiles' engine
    ({"overlap_decode_attention": True, "run_ahead": True}, FEATURES, [OVERLAP_LONG]),  # measured before the field
    ({"overlap_decode_attention": True}, {**FEATURES, "overlaps_decode_attention": True}, []),
    ({"overlap_decode_attention": False}, {**FEATURES, "overlaps_decode_attention": True},
     ["the real engine ran without overlap_decode_attention and the profile's engine with: its mixed steps (decode "
      "rows beside prefill chunks) are priced short (on an H100 an engine with it served 4-9 % more than a profile "
      "without it put its knee at)"]),
    ({"run_ahead": False}, FEATURES, ["the real engine ran without run-ahead and the profile's engine with: its "
                                      "decode steps that repeat their batch are priced short"]),
    ({"run_ahead": True}, {"runs_decode_ahead": False}, ["the real engine ran with run-ahead and the profile's engine "
                                                          "without: its decode steps that repeat their batch are "
                                                          "priced long"]),
    ({"overlap_decode_attention": True}, None, []),  # the roofline, or a run from before the record: nothing known
    ({}, FEATURES, []),  # a real run that does not record the options (served over HTTP, imported)
    ({"overlap_decode_attention": "yes"}, {"overlaps_decode_attention": 1}, []),  # not booleans: not judged
])
def test_engine_notes(real, features, expected):
    sim = {} if features is None else {"profile_engine_features": features}
    assert engine_notes(real, sim) == expected


def test_the_profiles_features_are_no_config_difference():
    assert config_differences({"model": "m"}, {"model": "m", "profile_engine_features": FEATURES}) == {}


def test_cli_prints_and_writes_the_notes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = write_run(tmp_path / "real", real_requests(), real_steps(),
                     {"config": {"model": "m", "overlap_decode_attention": True, "run_ahead": True}})
    sim = write_run(tmp_path / "sim", sim_requests(), sim_steps(),
                    {"cost_model": "profile:h100/m", "config": {"model": "m", "profile_engine_features": FEATURES}})
    out = tmp_path / "out"
    code, stdout, stderr = run_cli([str(real), str(sim), "--out", str(out)], capsys)
    assert code == 0, stderr
    assert f"note: {OVERLAP_LONG}\n" in stdout
    assert "profile_engine_features" not in stdout and "config differences: overlap_decode_attention" in stdout
    assert json.loads((out / "compare.json").read_text())["engine_notes"] == [OVERLAP_LONG]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "engine notes" in page and "priced long" in page


def test_a_simulation_records_its_profiles_engine_features(tmp_path: Path) -> None:
    """sim.replay under a shipped profile writes what that profile's engine did into its config."""
    from cli.sim_replay import main as replay_main

    trace = Path(__file__).resolve().parents[2] / "traces" / "sharegpt.parquet"
    out = tmp_path / "run"
    assert replay_main([str(trace), "--limit", "20", "--out", str(out), "--no-report", "--gpu", "h100"]) == 0
    config = json.loads((out / "summary.json").read_text())["config"]
    shipped = json.loads((Path(__file__).resolve().parents[2] / "sim" / "profiles" / "h100" / "qwen3-0.6b.json")
                         .read_text())["engine_features"]
    assert config["profile_engine_features"] == shipped and shipped["runs_decode_ahead"] is True
    roofline = tmp_path / "roofline"
    assert replay_main([str(trace), "--limit", "20", "--out", str(roofline), "--no-report", "--cost-model",
                        "roofline"]) == 0
    assert "profile_engine_features" not in json.loads((roofline / "summary.json").read_text())["config"]
