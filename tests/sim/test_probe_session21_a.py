"""Hostile-input probe (session 21, A): simulator limits past what a run's tables hold."""

from __future__ import annotations

import pytest

from analysis.capacity.cli import main as capacity_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-num-seqs", str(10**20)], "--max-num-seqs: max_num_seqs must be at most 2**40 (1,099,511,627,776), "
                                      "got 100000000000000000000"),
    (["--max-model-len", str(10**20), "--allow-long-max-model-len"],
     "--max-model-len: max_model_len must be at most 2**40 (1,099,511,627,776), got 100000000000000000000"),
])
def test_replay_refuses_limits_past_2_to_the_40(tmp_path, capsys, args, expected) -> None:
    """Both simulated at exit 0 (the engine stops below 2**31)."""
    out = tmp_path / "out"
    line = cli_error(replay_main, [str(SHAREGPT), "--limit", "5", "--out", str(out), "--quiet", *args], capsys)
    assert line == f"error: {expected}"
    assert not out.exists()


def test_capacity_refuses_a_max_num_seqs_its_parquet_cannot_hold(tmp_path, capsys) -> None:
    """--max-num-seqs 256,10**20 swept both and wrote capacity.parquet with an Int128 column: pyarrow (and pandas)
    could not read the file ("Integers with more than 64 bits not implemented")."""
    out = tmp_path / "out"
    line = cli_error(capacity_main, [str(SHAREGPT), "--slo", "ttft_p90=2s", "--max-num-seqs", f"256,{10**20}",
                                     "--quiet", "--out", str(out)], capsys)
    assert line == ("error: --max-num-seqs: max_num_seqs must be at most 2**40 (1,099,511,627,776), got "
                    "100000000000000000000")
    assert not out.exists()
