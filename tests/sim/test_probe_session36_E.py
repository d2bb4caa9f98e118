"""Session 36, helper E: an option value that may be a file or something else, too long to be a file name.

``--host-slowdown 1.000...`` or ``--gpu-cost h200=3.000...`` (a number of 300 digits: past the file system's 255
bytes a name) made Path.exists() and is_file() raise "File name too long": sim.replay and analysis.capacity refused
valid values as "--out DIR: File name too long", and a long word as --host-slowdown was blamed on --out too (or
named without its option), where it is no file and no number."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.capacity.cost import DEFAULT_GPU_COST_PER_HOUR_USD, load_gpu_costs
from analysis.capacity.ray_executor import _shipped_path
from analysis.outdir import input_files
from cli.sim_replay import main as sim_replay
from sim.host_speed import ConstantHostSpeed, parse_host_slowdown
from tests.sim.helpers import write_trace
from traces.files import existing_path

LONG_ONE = "1." + "0" * 300  # a valid number; as a file name, over 255 bytes
LONG_PRICE = "h200=3." + "0" * 300
LONG_WORD = "x" * 300


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "t.parquet", [10, 10, 10], [5, 5, 5], arrival_s=[0.0, 0.1, 0.2])


def test_existing_path_is_none_for_a_name_too_long_or_missing_and_the_path_otherwise(tmp_path: Path) -> None:
    assert existing_path(LONG_ONE) is None  # Path(LONG_ONE).exists() raises OSError (ENAMETOOLONG)
    assert existing_path(tmp_path / ("a" * 300)) is None
    assert existing_path(tmp_path / "missing") is None
    assert existing_path(str(tmp_path)) == tmp_path
    (tmp_path / "f.csv").write_text("start_s,slowdown\n0,1\n")
    assert existing_path(str(tmp_path / "f.csv")) == tmp_path / "f.csv"


def test_input_files_skip_option_values_too_long_to_be_files(trace: Path) -> None:
    args = argparse.Namespace(trace=str(trace), cost_model="auto", host_slowdown=LONG_ONE, gpu_cost=LONG_PRICE)
    assert input_files(args) == [trace]


def test_a_long_number_is_a_constant_host_slowdown_and_a_long_word_is_refused_by_its_option() -> None:
    speed = parse_host_slowdown(LONG_ONE)
    assert isinstance(speed, ConstantHostSpeed)
    assert speed.slowdown_at(0.0) == 1.0
    with pytest.raises(ValueError) as refused:
        parse_host_slowdown(LONG_WORD)
    assert str(refused.value) == (f"--host-slowdown {LONG_WORD!r}: expected 'calibrated', a number, "
                                  "episodes:NORMAL,SLOW,FRACTION,MEAN_S or a CSV file (start_s,slowdown)")
    with pytest.raises(ValueError) as refused:
        parse_host_slowdown("/tmp/" + LONG_WORD + ".csv")
    assert str(refused.value) == (f"--host-slowdown {'/tmp/' + LONG_WORD + '.csv'!r}: the file does not exist; "
                                  "expected a CSV file (start_s,slowdown)")


def test_long_price_pairs_are_prices_and_a_long_word_is_neither_file_nor_pairs() -> None:
    assert load_gpu_costs(LONG_PRICE) == {**DEFAULT_GPU_COST_PER_HOUR_USD, "h200": 3.0}
    with pytest.raises(ValueError) as refused:
        load_gpu_costs(LONG_WORD)
    assert str(refused.value) == (f"{LONG_WORD!r} is neither a file nor GPU=USD_PER_HOUR pairs such as "
                                  "h200=3.5,h100=2.5")


def test_ray_ships_no_file_for_a_long_number(tmp_path: Path) -> None:
    assert _shipped_path(LONG_ONE) is None
    assert _shipped_path(str(tmp_path)) == tmp_path


def test_sim_replay_runs_with_a_long_host_slowdown_number(tmp_path: Path, trace: Path, capsys) -> None:
    out = tmp_path / "run"
    assert sim_replay([str(trace), "--host-slowdown", LONG_ONE, "--out", str(out), "--no-report", "--quiet"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["requests.parquet", "steps.parquet", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["host_slowdown"] == LONG_ONE
    assert summary["num_finished"] == 3
    # the same run as --host-slowdown 1
    plain = tmp_path / "plain"
    assert sim_replay([str(trace), "--host-slowdown", "1", "--out", str(plain), "--no-report", "--quiet"]) == 0
    assert pl.read_parquet(out / "requests.parquet").equals(pl.read_parquet(plain / "requests.parquet"))
    assert capsys.readouterr().err == ""


def test_sim_replay_names_the_option_of_a_long_word(tmp_path: Path, trace: Path, capsys) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        sim_replay([str(trace), "--host-slowdown", LONG_WORD, "--out", str(out), "--no-report", "--quiet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: --host-slowdown {LONG_WORD!r}: expected 'calibrated', a number, "
                                       "episodes:NORMAL,SLOW,FRACTION,MEAN_S or a CSV file (start_s,slowdown)\n")
    assert not out.exists()


@pytest.mark.parametrize(("option", "value", "error"), [
    ("--host-slowdown", LONG_WORD, f"error: --host-slowdown {LONG_WORD!r}: expected 'calibrated', a number, "
                                   "episodes:NORMAL,SLOW,FRACTION,MEAN_S or a CSV file (start_s,slowdown)\n"),
    ("--gpu-cost", LONG_WORD, f"error: --gpu-cost: {LONG_WORD!r} is neither a file nor GPU=USD_PER_HOUR pairs such "
                              "as h200=3.5,h100=2.5\n"),
])
def test_capacity_names_the_option_of_a_long_word(tmp_path: Path, trace: Path, capsys, option, value, error) -> None:
    out = tmp_path / "cap"
    with pytest.raises(SystemExit) as stopped:
        capacity_main([str(trace), "--slo", "ttft_p90=2s", option, value, "--out", str(out), "--quiet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == error
    assert not out.exists()


def test_capacity_runs_with_long_price_pairs_and_host_slowdown(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "cap"
    assert capacity_main([str(trace), "--slo", "ttft_p90=2s", "--gpu-cost", LONG_PRICE, "--host-slowdown", LONG_ONE,
                          "--max-iterations", "1", "--jobs", "1", "--out", str(out), "--quiet"]) == 0
    (result,) = json.loads((out / "capacity.json").read_text())
    assert result["options"]["host_slowdown"] == LONG_ONE
    assert result["cost"]["usd_per_gpu_hour"] == 3.0


def test_a_cost_model_too_long_to_be_a_file_is_one_line_naming_it(tmp_path: Path, trace: Path, capsys) -> None:
    # analysis.capacity said "error: --out DIR: File name too long", blaming the output folder.
    why = f"{LONG_WORD}: File name too long; expected a path whose names are at most 255 bytes each (4096 in all)"
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        capacity_main([str(trace), "--slo", "ttft_p90=2s", "--cost-model", LONG_WORD, "--out", str(out), "--quiet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: configuration 'qwen3-0.6b h200 x1': {why}\n"
    with pytest.raises(SystemExit) as stopped:
        sim_replay([str(trace), "--cost-model", LONG_WORD, "--out", str(out), "--no-report", "--quiet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: {why}\n"
    assert not out.exists()
    # a missing file, as before
    missing = str(tmp_path / "missing.json")
    with pytest.raises(SystemExit) as stopped:
        sim_replay([str(trace), "--cost-model", missing, "--out", str(out), "--no-report", "--quiet"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (f"error: cost model {missing!r} is neither 'auto', 'roofline' nor an existing "
                                       "profile JSON\n")
