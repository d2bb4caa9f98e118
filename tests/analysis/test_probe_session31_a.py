"""Probe A, session 31: analysis.compare of a simulated run whose steps.parquet was emptied.

Its requests got tokens, yet the comparison went on as if it were a run served over HTTP: "engine steps n/a" and
"schedule diff: n/a (... a run served over HTTP or imported from another tool)", which its summary.json says it is
not."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from analysis.compare.cli import main as compare_main
from tests.traces.helpers import cli_error
from traces.schema import save_trace


def _replay(trace: Path, out: Path) -> None:
    from cli.sim_replay import main

    assert main([str(trace), "--quiet", "--no-report", "--out", str(out)]) == 0


def test_a_simulated_run_without_its_step_log_is_refused(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.parquet"
    save_trace(pl.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [10, 10, 10],
                             "output_tokens": [5, 5, 5]}), trace)
    real, sim = tmp_path / "real", tmp_path / "sim"
    _replay(trace, real)
    shutil.copytree(real, sim)
    steps = pl.read_parquet(sim / "steps.parquet")
    steps.head(0).write_parquet(sim / "steps.parquet")
    capsys.readouterr()
    line = cli_error(compare_main, [str(real), str(sim), "--out", str(tmp_path / "cmp")], capsys)
    assert line == (f"error: {sim / 'steps.parquet'}: holds no steps, yet 3 request(s) got tokens; expected the step "
                    "log of a simulated run, as its summary.json says it is")
    assert not (tmp_path / "cmp").exists()
    # The whole run still compares.
    shutil.copy(real / "steps.parquet", sim / "steps.parquet")
    assert compare_main([str(real), str(sim), "--out", str(tmp_path / "cmp")]) == 0
