"""Hostile input to the validation scripts (decode_fits, step_errors, kv_sensitivity, profile_diff): exit 2 with
one line naming the file or option, no traceback, and --json written whole, never onto an input nor through a link."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.profiled_cost_model import find_profile
from tests.traces.helpers import REPO_ROOT, cli_error
from validation import kv_sensitivity
from validation.decode_fits import main as decode_fits_main
from validation.profile_diff import main as profile_diff_main
from validation.step_errors import main as step_errors_main

PROFILE = find_profile("qwen3-0.6b", "h200")


def _bad_profiles(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (profile path, what the one error line says after naming it)."""
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "garbage.json").write_text('{"points": 3')
    (tmp_path / "folder.json").mkdir()
    return {"missing": (tmp_path / "missing.json", "no such file"),
            "empty": (tmp_path / "empty.json", "Expecting value"),
            "garbage": (tmp_path / "garbage.json", "delimiter"),
            "a folder": (tmp_path / "folder.json", "is a directory")}


def _run_folder(tmp_path: Path) -> Path:
    """A folder with both tables (empty files): the profile is checked before they are read."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        (run / name).write_bytes(b"")
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay's: a GPU run
    return run


@pytest.mark.parametrize("tool", ["decode_fits", "step_errors", "step_errors --bucket-fit"])
def test_a_missing_empty_garbled_or_folder_profile_is_one_line(tmp_path, capsys, tool):
    """Each was a ValueError traceback (exit 1)."""
    run = _run_folder(tmp_path)
    for name, (profile, reason) in _bad_profiles(tmp_path).items():
        if tool == "decode_fits":
            line = cli_error(decode_fits_main, [str(run), "--calibration", str(run), "--profile", str(profile)], capsys)
        else:
            line = cli_error(step_errors_main, [str(run), "--profile", str(profile), *tool.split()[1:]], capsys)
        assert line.startswith("error: ") and str(profile) in line and reason in line, (name, line)


@pytest.mark.parametrize("main", [decode_fits_main, step_errors_main], ids=["decode_fits", "step_errors"])
def test_an_empty_profile_option_is_refused(tmp_path, capsys, main):
    """--profile "" silently used the shipped profile."""
    run = _run_folder(tmp_path)
    argv = [str(run), "--profile", ""] + (["--calibration", str(run)] if main is decode_fits_main else [])
    assert cli_error(main, argv, capsys) == "error: --profile is empty; expected a profile JSON (python -m sim.profile)"


def test_decode_fits_names_a_run_without_its_tables(tmp_path, capsys):
    run = _run_folder(tmp_path)
    (run / "steps.parquet").unlink()
    line = cli_error(decode_fits_main, [str(run), "--calibration", str(run)], capsys)
    assert line == f"error: {run}: no steps.parquet; expected an engine.replay run folder"
    (run / "steps.parquet").write_bytes(b"")
    (run / "requests.parquet").write_bytes(b"not parquet")  # a polars traceback
    line = cli_error(decode_fits_main, [str(run), "--calibration", str(run), "--profile", str(PROFILE)], capsys)
    assert line.startswith(f"error: {run / 'requests.parquet'}: not a readable replay table ("), line


def test_decode_fits_and_step_errors_as_commands_are_one_line(tmp_path):
    profile = tmp_path / "empty.json"
    profile.write_text("")
    run = _run_folder(tmp_path)
    for script, extra in (("decode_fits.py", ["--calibration", str(run)]), ("step_errors.py", [])):
        proc = subprocess.run([sys.executable, f"validation/{script}", str(run), *extra, "--profile", str(profile)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and str(profile) in proc.stderr, proc.stderr


# --- profile_diff ----------------------------------------------------------------------------------------------

def _profile_copy(path: Path, mutate=None) -> Path:
    data = json.loads(PROFILE.read_text())
    if mutate:
        mutate(data)
    path.write_text(json.dumps(data))
    return path


def test_profile_diff_bad_input_is_exit_2(tmp_path, capsys):
    """It exited 1 (SystemExit with a message) on every bad input; a point missing its median was a traceback."""
    good = _profile_copy(tmp_path / "a.json")
    for name, (profile, reason) in _bad_profiles(tmp_path).items():
        line = cli_error(profile_diff_main, [str(good), str(profile)], capsys)
        assert line.startswith(f"error: {profile}: ") and reason in line, (name, line)

    def no_median(data):
        del data["points"][0]["median_s"]

    def decode_of_lists(data):
        data["points"][2]["decode"] = [[1]]

    line = cli_error(profile_diff_main, [str(good), str(_profile_copy(tmp_path / "m.json", no_median))], capsys)
    assert line.startswith(f"error: {tmp_path / 'm.json'}: points[0]: "), line
    line = cli_error(profile_diff_main, [str(good), str(_profile_copy(tmp_path / "d.json", decode_of_lists))], capsys)
    assert line.startswith(f"error: {tmp_path / 'd.json'}: points[2]: expected 'decode' (a list)"), line


def test_profile_diff_of_profiles_sharing_no_point_is_exit_2(tmp_path, capsys):
    def rename(data):
        for point in data["points"]:
            point["family"] = "other-" + point["family"]

    a, b = _profile_copy(tmp_path / "a.json"), _profile_copy(tmp_path / "b.json", rename)
    line = cli_error(profile_diff_main, [str(a), str(b)], capsys)
    assert line == f"error: {a} and {b} share no grid point; expected two profiles of one grid"
    assert profile_diff_main([str(a), str(a)]) == 0  # and two of one grid still compare


# --- kv_sensitivity --json ---------------------------------------------------------------------------------------

@pytest.fixture
def kv_trace(tmp_path, monkeypatch) -> Path:
    """The validation slice (an ignored file, absent from a fresh checkout) in a folder of the test's; the
    simulations stubbed: one writing a summary per call, or none at all where --json must be refused first."""
    traces = tmp_path / "traces"
    traces.mkdir()
    trace = traces / kv_sensitivity.PLAN[kv_sensitivity.RUN][1]
    trace.write_bytes(b"the trace")
    monkeypatch.setattr(kv_sensitivity, "TRACES", traces)
    return trace


def _stub_replay(monkeypatch, calls: list):
    import cli.sim_replay

    def replay(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"num_preemptions": 3, "tpot_ms": {"p90": 1.0},
                                                      "ttft_ms": {"p90": 2.0}, "cost_model": "stub"}))
        return 0

    monkeypatch.setattr(cli.sim_replay, "main", replay)


@pytest.mark.parametrize("where", ["the trace", "a folder", "under a file", "ends with /"])
def test_kv_sensitivity_json_is_refused_before_simulating(tmp_path, capsys, monkeypatch, kv_trace, where):
    """--json onto the trace replaced it, and a folder or a path under a file failed after every simulation."""
    calls: list = []
    _stub_replay(monkeypatch, calls)
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    out = {"the trace": str(kv_trace), "a folder": str(tmp_path / "folder"),
           "under a file": str(tmp_path / "file" / "out.json"), "ends with /": str(tmp_path / "new") + "/"}[where]
    line = cli_error(kv_sensitivity.main, ["--slowdowns", "1.0", "--json", out], capsys)
    assert line.startswith(f"error: --json {out}"), line
    assert calls == [] and kv_trace.read_bytes() == b"the trace" and (tmp_path / "file").read_text() == "x"


def test_kv_sensitivity_json_replaces_a_link_and_makes_its_folder(tmp_path, capsys, monkeypatch, kv_trace):
    calls: list = []
    _stub_replay(monkeypatch, calls)
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    link = tmp_path / "out.json"
    link.symlink_to(precious)
    assert kv_sensitivity.main(["--slowdowns", "1.0,1.2", "--json", str(link)]) == 0
    assert precious.read_text() == "keep me\n" and not link.is_symlink()
    assert [row["host_slowdown"] for row in json.loads(link.read_text())["rows"]] == ["1.0", "1.2"]
    nested = tmp_path / "new" / "deeper" / "out.json"
    assert kv_sensitivity.main(["--slowdowns", "1.0", "--json", str(nested)]) == 0
    assert json.loads(nested.read_text())["run"] == kv_sensitivity.RUN
    assert len(calls) == 3 and not list(tmp_path.glob("**/.*partial*"))
