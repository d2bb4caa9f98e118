"""Hostile model folders (probe H, session 26): sim.replay found its measured profile by the --model folder's name
alone, so a folder named qwen3-0.6b holding another model's config.json (a tiny test model, a 70B renamed) was priced
by qwen3-0.6b's measured step times, as if it were that model, without a word. Such a folder now gets the roofline and
a no_profile warning that says why; a folder named and shaped as a shipped model still gets its profile. And --model .
was the model named '' (no folder name), whose profile was never found."""

from __future__ import annotations

import json

from cli.sim_replay import main as replay_main
from tests.sim.helpers import REPO, write_trace

CONFIGS = REPO / "engine" / "configs"


def _replay(tmp_path, model, name: str) -> dict:
    trace = write_trace(tmp_path / "t.parquet", [100] * 3, [5] * 3, [0.0, 0.1, 0.2])
    out = tmp_path / name
    assert replay_main([str(trace), "--model", str(model), "--out", str(out), "--no-report", "--quiet"]) == 0
    return json.loads((out / "summary.json").read_text())


def test_a_folder_named_as_a_profiled_model_but_holding_another_is_not_priced_by_its_profile(tmp_path) -> None:
    model = tmp_path / "x" / "qwen3-0.6b"
    model.mkdir(parents=True)
    config = json.loads((CONFIGS / "qwen3-0.6b" / "config.json").read_text())
    config.update(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36)
    (model / "config.json").write_text(json.dumps(config))
    summary = _replay(tmp_path, model, "a")
    assert summary["warnings"] == [{
        "code": "no_profile", "value": None, "limit": None,
        "message": "the model is named qwen3-0.6b but is another model (hidden_size 4096, not 1024), so "
                   "sim/profiles/h200/qwen3-0.6b.json does not price it: step times are the roofline estimate, not "
                   "validated against a GPU"}]
    assert "roofline" in json.dumps(summary["config"])


def test_a_copy_of_a_shipped_model_keeps_its_profile(tmp_path) -> None:
    model = tmp_path / "x" / "qwen3-0.6b"
    model.mkdir(parents=True)
    (model / "config.json").write_bytes((CONFIGS / "qwen3-0.6b" / "config.json").read_bytes())
    summary = _replay(tmp_path, model, "b")
    assert summary["warnings"] == []
    assert "profile:h200/qwen3-0.6b" in json.dumps(summary["config"])


def test_a_model_folder_given_as_dot_is_named_by_the_folder(tmp_path, monkeypatch) -> None:
    """--model . was the model '' ("no measured profile for  on h200 ... (sim/profiles/h200/.json does not exist)"),
    in a copy of qwen3-0.6b and in engine/configs/qwen3-0.6b itself."""
    model = tmp_path / "qwen3-0.6b"
    model.mkdir()
    (model / "config.json").write_bytes((CONFIGS / "qwen3-0.6b" / "config.json").read_bytes())
    monkeypatch.chdir(model)
    summary = _replay(tmp_path, ".", "c")
    assert summary["warnings"] == []
    assert "profile:h200/qwen3-0.6b" in json.dumps(summary["config"])
