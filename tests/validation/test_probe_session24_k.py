"""Session 24, probe K: validation/compare_all.py --bands beyond sim.replay's bound."""

from __future__ import annotations

import json

from tests.traces.helpers import cli_error
from validation import compare_all


def test_bands_beyond_the_simulators_bound_are_refused_before_any_folder_is_touched(tmp_path, capsys):
    """--bands 1001 passed compare_all's check; the first run's earlier simulation was removed, and only then did
    sim.replay refuse the option."""
    real = tmp_path / "real" / "b-azure-p70"
    real.mkdir(parents=True)
    (real / "requests.parquet").write_bytes(b"the GPU run")
    (real / "summary.json").write_text(json.dumps({"config": {"num_gpu_blocks": 300}}))
    earlier = tmp_path / "sim" / "b-azure-p70"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text("{}")
    argv = ["--real", str(tmp_path / "real"), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "r"),
            "--bands", "1001"]
    assert cli_error(compare_all.main, argv, capsys) == ("error: --bands must be an integer from 2 to 1000 (the number "
                                                         "of seeded replays; a band needs at least two), got '1001'")
    assert (earlier / "summary.json").read_text() == "{}" and not (tmp_path / "r").exists()
