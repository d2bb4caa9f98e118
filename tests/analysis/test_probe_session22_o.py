"""Hostile-input probe (session 22, O): damaged run folders given to analysis.summarize and analysis.compare."""

from __future__ import annotations

import os

import polars as pl
import pytest

from analysis.compare.cli import main as compare_main
from analysis.summarize import main as summarize_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe_o") / "run"
    assert replay_main([str(SHAREGPT), "--limit", "5", "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def _damaged(run_dir, tmp_path, table: str, change) -> tuple:
    """A copy of ``run_dir`` whose ``table`` is ``change(frame)``; returns (folder, its files' bytes)."""
    folder = tmp_path / "damaged"
    folder.mkdir()
    for name in ("requests.parquet", "steps.parquet", "summary.json"):
        (folder / name).write_bytes((run_dir / name).read_bytes())
    path = folder / f"{table}.parquet"
    change(pl.read_parquet(path)).write_parquet(path)
    return folder, {p.name: p.read_bytes() for p in folder.iterdir()}


def _row(column: str, row: int, value):
    return pl.when(pl.int_range(pl.len()) == row).then(value).otherwise(pl.col(column)).alias(column)


@pytest.mark.parametrize("column", ["prompt_tokens", "output_tokens"])
def test_a_null_token_count_is_refused(run_dir, tmp_path, capsys, column) -> None:
    """A null output_tokens was summed as 0: total_output_tokens and the output throughput silently fell."""
    folder, before = _damaged(run_dir, tmp_path, "requests", lambda f: f.with_columns(_row(column, 2, None)))
    line = cli_error(summarize_main, [str(folder), "--quiet"], capsys)
    assert line == (f"error: {folder}/requests.parquet: requests table: column {column!r} is null at row 2; "
                    "expected an integer >= 0")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_more_cached_than_prompt_tokens_is_refused(run_dir, tmp_path, capsys) -> None:
    """cached_tokens above prompt_tokens gave a prefix-cache hit rate above 100 % (1.00435), summarized as fine."""
    folder, before = _damaged(run_dir, tmp_path, "requests",
                              lambda f: f.with_columns(_row("cached_tokens", 1, pl.col("prompt_tokens") + 5)))
    prompt = pl.read_parquet(run_dir / "requests.parquet")["prompt_tokens"][1]
    line = cli_error(summarize_main, [str(folder), "--quiet"], capsys)
    assert line == (f"error: {folder}/requests.parquet: requests table: column 'cached_tokens' is {prompt + 5} at "
                    f"row 1; expected at most prompt_tokens ({prompt}): a cached token is a prompt token")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_null_kv_usage_is_refused(run_dir, tmp_path, capsys) -> None:
    """Steps with a null kv_usage (no engine writes one) made mean_kv_usage 0.0, written as measured."""
    folder, before = _damaged(run_dir, tmp_path, "steps",
                              lambda f: f.with_columns(pl.lit(None, dtype=pl.Float64).alias("kv_usage")))
    line = cli_error(summarize_main, [str(folder), "--quiet"], capsys)
    assert line == (f"error: {folder}/steps.parquet: steps table: column 'kv_usage' is null at row 0; expected a "
                    "value in every step")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_repeated_step_is_refused_by_summarize(run_dir, tmp_path, capsys) -> None:
    """A step row given twice was counted twice (num_steps 5154 of 5151); compare already refused it."""
    folder, before = _damaged(run_dir, tmp_path, "steps", lambda f: pl.concat([f, f.slice(3, 1)]))
    rows = pl.read_parquet(run_dir / "steps.parquet").height
    line = cli_error(summarize_main, [str(folder), "--quiet"], capsys)
    assert line == (f"error: {folder}/steps.parquet: steps table: column 'step' is 3 at row {rows}; expected one row "
                    "per step of a replica (replica 0, step 3 is also at row 3)")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.parametrize("which", ["real", "sim", "out"])
def test_compare_of_a_symlink_loop_is_one_line(run_dir, tmp_path, capsys, which) -> None:
    """A folder that is a symbolic link loop was a RuntimeError traceback (Path.resolve), exit 1."""
    loop = tmp_path / "loop"
    os.symlink(tmp_path / "loop2", loop)
    os.symlink(loop, tmp_path / "loop2")
    args = {"real": [str(loop), str(run_dir)], "sim": [str(run_dir), str(loop)],
            "out": [str(run_dir), str(run_dir), "--out", str(loop)]}[which]
    if which != "out":
        args += ["--out", str(tmp_path / "cmp")]
    line = cli_error(compare_main, args, capsys)
    assert line == f"error: {loop}: a symbolic link loop; expected a folder"
    assert not (tmp_path / "cmp").exists()


def test_times_as_durations_are_refused(run_dir, tmp_path, capsys) -> None:
    """Time columns stored as Duration (or Datetime) cast to microseconds: a 10.9 s run summarized as 10874200 s
    with TTFTs a million-fold, exit 0."""
    folder, before = _damaged(run_dir, tmp_path, "requests", lambda f: f.with_columns(
        pl.duration(microseconds=(pl.col("arrival_s") * 1e6).round().cast(pl.Int64)).alias("arrival_s")))
    line = cli_error(summarize_main, [str(folder), "--quiet"], capsys)
    assert line == (f"error: {folder}/requests.parquet: requests table: column 'arrival_s' holds Duration(time_unit="
                    "'us') values that do not convert to Float64")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
