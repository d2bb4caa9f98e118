"""Hostile-input probe (session 25, E): what sim.replay prints of a --model folder's and a --cost-model profile's
names, and of the profile's own strings."""

from __future__ import annotations

import json
import re

from cli.sim_replay import main as replay_main
from sim.limits import format_warnings
from tests.sim.helpers import REPO, write_trace

CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # every control character but tab and newline


def test_format_warnings_is_one_line_per_warning() -> None:
    assert format_warnings([{"code": "c\x1b[1m", "message": "a\nb\rc"}, {"code": "d", "message": "e"}]) == (
        "warning [c\\x1b[1m]: a\\nb\\rc\nwarning [d]: e")


def test_a_model_folder_and_a_profile_name_are_printed_escaped(tmp_path, capsys) -> None:
    """A --model folder named with an ANSI escape and a newline reached the no_profile warning raw (it recoloured the
    terminal and split the line); a --cost-model file's name and its measured_at reached the "cost model:" line raw
    (a carriage return there overwrote the line)."""
    model = tmp_path / "m\x1b[33m<b>\nX"
    model.mkdir()
    (model / "config.json").write_bytes((REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json").read_bytes())
    trace = write_trace(tmp_path / "t.parquet", [100] * 3, [5] * 3, [0.0, 0.1, 0.2])
    assert replay_main([str(trace), "--model", str(model), "--out", str(tmp_path / "a"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    assert ("warning [no_profile]: no measured profile for m\\x1b[33m<b>\\nX on h200 at tensor-parallel size 1 "
            "(sim/profiles/h200/m\\x1b[33m<b>\\nX.json does not exist): step times are the roofline estimate, not "
            "validated against a GPU") in out.splitlines()

    profile = json.loads((REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json").read_text())
    profile["measured_at"] = "2026\x1b[31m\rX"
    path = tmp_path / "p\x1b[32m|.json"
    path.write_text(json.dumps(profile))
    assert replay_main([str(trace), "--cost-model", str(path), "--out", str(tmp_path / "b"), "--no-report"]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    assert out.splitlines()[-1].startswith("cost model: profile:h200/p\\x1b[32m| (measured 2026\\x1b[31m\\rX), ")
