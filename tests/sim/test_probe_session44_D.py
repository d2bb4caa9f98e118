"""Session 44 (helper D): a profile (or any JSON input read through sim.files.read_json_input) behind a symbolic
link loop was refused as "no such file"."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.profiled_cost_model import read_profile
from tests.traces.helpers import link_loop


def test_a_profile_behind_a_link_loop_is_named_so(tmp_path: Path) -> None:
    loop = link_loop(tmp_path, "profile.json", "other.json")
    with pytest.raises(ValueError) as refused:
        read_profile(loop)
    assert str(refused.value) == f"{loop}: cannot read the profile (a symbolic link loop)"
