"""Session 25, probe C: bad arguments to the validation scripts (mixed_decode_rows, profile_diff, decode_fits,
compare_all, band_check): tracebacks, a measurement run on the CPU for minutes, outputs silently skipped or
written into the current folder."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sim.profiled_cost_model import find_profile
from tests.traces.helpers import REPO_ROOT, cli_error
from validation import band_check, compare_all
from validation.decode_fits import main as decode_fits_main
from validation.profile_diff import main as profile_diff_main

PROFILE = find_profile("qwen3-0.6b", "h200")


def _mixed_decode_rows(argv: list[str]) -> str:
    """Run the script as a command: exit 2, one line and no traceback, well before any model is built."""
    proc = subprocess.run([sys.executable, "validation/mixed_decode_rows.py", *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(("argv", "line"), [
    (["--model", "nosuch"], "error: --model nosuch: model 'nosuch' is neither a directory with a config.json nor a "
                            "shipped config"),
    (["--max-model-len", "0"], "error: --max-model-len: max_model_len must be an integer >= 1, got 0"),
    (["--max-model-len", "1000"], "error: --max-model-len 1000 is below the longest sequence the cases build (4104 "
                                  "tokens); expected >= 4104"),
    (["--max-model-len", "100000"], "error: --max-model-len 100000 is more than qwen3-0.6b's max_position_embeddings; "
                                    "expected <= 40960"),
    (["--json", ""], "error: --json is empty; expected a file path"),
    (["--json", "{tmp}"], "error: --json {tmp} is a directory; expected a file path"),
], ids=["unknown model", "max-model-len 0", "max-model-len too short", "max-model-len too long", "empty json",
        "json a folder"])
def test_mixed_decode_rows_refuses_bad_arguments_before_building_the_model(tmp_path, argv, line):
    """Each was a traceback once the model was built (--max-model-len 1000 after a minute and a half on the CPU), or
    the measurement ran and then failed to write (--json a folder), or wrote nothing without a word (--json "")."""
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    assert _mixed_decode_rows(argv).startswith(line.replace("{tmp}", str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


def test_mixed_decode_rows_without_a_gpu_says_so_instead_of_running_on_the_cpu(tmp_path):
    """It needs a CUDA GPU (its docstring says so), but the engine fell back to the CPU without a word and ran for
    many minutes, to print figures that are not the GPU's."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    out = tmp_path / "medians.json"
    assert _mixed_decode_rows(["--samples", "1", "--json", str(out)]) == (
        "error: this script times engine steps on a CUDA GPU and found none")
    assert not out.exists()


@pytest.mark.parametrize("which", ["a", "b"])
def test_profile_diff_refuses_an_empty_profile_argument(capsys, which):
    """Path("") is the current folder: the line was '.: cannot read the profile (is a directory; expected a file)'."""
    argv = ["", str(PROFILE)] if which == "a" else [str(PROFILE), ""]
    assert cli_error(profile_diff_main, argv, capsys) == (
        f"error: argument {which}: is empty; expected a path or a value (--help lists the options)")


def test_profile_diff_refuses_a_family_no_common_point_has(capsys):
    """--family nosuch printed the heading of the per-point list over no point at exit 0."""
    line = cli_error(profile_diff_main, [str(PROFILE), str(PROFILE), "--family", "nosuch"], capsys)
    assert line.startswith("error: --family 'nosuch': no common grid point of that family; expected one of decode, ")


def test_decode_fits_refuses_empty_run_arguments(tmp_path, capsys):
    """An empty run was '.: no requests.parquet', a folder nobody typed (or the folder one stood in, read as a run)."""
    assert cli_error(decode_fits_main, ["", "--calibration", str(tmp_path)], capsys) == (
        "error: argument runs: is empty; expected a path or a value (--help lists the options)")
    assert cli_error(decode_fits_main, [str(tmp_path), "--calibration", ""], capsys) == (
        "error: argument --calibration: is empty; name a file (--help lists the options)")


@pytest.mark.parametrize("option", ["--real", "--sim-out", "--results"])
def test_compare_all_refuses_an_empty_folder_option(tmp_path, capsys, monkeypatch, option):
    """"" was the current folder: with --results "" the simulations ran and errors.md and the figures were written
    wherever the command was run from."""
    import cli.sim_replay

    calls = []
    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: calls.append(argv))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "real" / "b-azure-p70"
    run.mkdir(parents=True)
    (run / "requests.parquet").write_bytes(b"the GPU run")
    folders = {"--real": str(tmp_path / "real"), "--sim-out": str(tmp_path / "sim"), "--results": str(tmp_path / "r")}
    argv = [arg for flag, value in {**folders, option: ""}.items() for arg in (flag, value)]
    assert cli_error(compare_all.main, argv, capsys) == (
        f"error: argument {option}: is empty; name a file (--help lists the options)")
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["real"]


@pytest.mark.parametrize("option", ["--out", "--results"])
def test_band_check_refuses_an_empty_folder_option(tmp_path, capsys, monkeypatch, option):
    """--out "" passed the output check as bands.md in the current folder, where the table was written once every
    run had been simulated."""
    monkeypatch.chdir(tmp_path)
    assert cli_error(band_check.main, [option, ""], capsys) == (
        f"error: argument {option}: is empty; name a file (--help lists the options)")
    assert list(tmp_path.iterdir()) == []
