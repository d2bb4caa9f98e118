"""validation/band_check.py checks a configuration's GPU repeats against its band, as compare_all names them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation.band_check import _gpu_runs  # noqa: E402


def test_a_runs_repeats_are_found_and_the_comparisons_between_them_are_not(tmp_path):
    for name in ("b-azure-p70", "b-azure-p70-b", "b-azure-p70-2", "b-azure-p70-b-vs-b-azure-p70", "b-azure-p95",
                 "e-prefill-p70-b"):
        (tmp_path / name).mkdir()
        if name != "b-azure-p70-2":  # a folder without a GPU summary is no run
            (tmp_path / name / "real_summary.json").write_text("{}")
    assert _gpu_runs(tmp_path, "b-azure-p70") == ["b-azure-p70", "b-azure-p70-b"]
    assert _gpu_runs(tmp_path, "b-azure-p95") == ["b-azure-p95"]
    assert _gpu_runs(tmp_path, "e-prefill-p70") == ["e-prefill-p70-b"]  # a repeat whose first run is not here
    assert _gpu_runs(tmp_path, "c-mooncake") == []
