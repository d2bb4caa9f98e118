"""Session 42 (helper E) probes of validation/step_errors.py and validation/compare_all.py: options that did nothing
at exit 0, and two output folders that were one, refused before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=300)


@pytest.mark.parametrize("option, unit", [("--batch-bin", "sequences"), ("--context-bin", "tokens")])
def test_step_errors_refuses_a_bin_of_zero(tmp_path, option, unit):
    # 0 split nothing, as if the option were left out, at exit 0 (-1 was refused)
    done = _script("validation/step_errors.py", str(tmp_path), option, "0")
    assert done.returncode == 2
    assert done.stderr == f"error: {option}: expected a number of {unit} >= 1, got 0\n"


@pytest.mark.parametrize("splits, named", [
    (["--split-finishing"], "--split-finishing"),
    (["--batch-bin", "8", "--context-bin", "512"], "--batch-bin and --context-bin"),
])
def test_step_errors_refuses_table_splits_beside_bucket_fit(tmp_path, splits, named):
    # --bucket-fit prints its fits instead of the step table: the splits were ignored at exit 0
    done = _script("validation/step_errors.py", str(tmp_path), "--bucket-fit", *splits)
    assert done.returncode == 2
    assert done.stderr == (f"error: --bucket-fit prints its fits, not the step table {named} would split; give one "
                           "or the other\n")


@pytest.mark.parametrize("host_timelines", [False, True])
def test_compare_all_refuses_results_in_the_sim_out_folder_before_simulating(tmp_path, host_timelines):
    # Each run was simulated, then its comparison folder (the same one) removed the simulation, and analysis.compare
    # refused to write over its input: exit 2 after the run, its simulation gone.
    real = tmp_path / "real" / "h-sharegpt-p70"
    real.mkdir(parents=True)
    (real / "requests.parquet").touch()  # a planned run's folder: nothing reads it before the refusal
    out = tmp_path / "out"
    flags = ["--host-timelines"] if host_timelines else []
    done = _script("validation/compare_all.py", "--real", str(tmp_path / "real"), "--sim-out", str(out),
                   "--results", f"{tmp_path}/./out", *flags)
    assert done.returncode == 2
    results = f"{tmp_path}/out/diagnosis" if host_timelines else f"{tmp_path}/out"
    assert done.stderr == (f"error: --results {results} is the --sim-out folder; expected a folder apart; nothing "
                           "written\n")
    assert not out.exists()  # --host-timelines made its folder first


@pytest.mark.parametrize("args, line", [
    (["--azure-calibration-start", "7999"], "--azure-calibration-start 7999 with --azure-start 2000 and --azure-count "
                                            "6000"),
    (["--mooncake-start", "1000", "--mooncake-calibration-start", "401"],
     "--mooncake-calibration-start 401 with --mooncake-start 1000 and --mooncake-count 600"),
])
def test_make_traces_refuses_a_calibration_slice_overlapping_the_validation_one(tmp_path, args, line):
    # the two slices shared requests at exit 0: a profile calibrated on the runs it was then validated on
    done = _script("validation/make_traces.py", "--shared", str(tmp_path), "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2
    assert done.stderr == (f"error: {line}: the slices overlap; expected the calibration slice disjoint from the "
                           "validation one\n")
    assert not (tmp_path / "out").exists()
