"""Hostile input to the CPU-runnable benchmarks and validation scripts (session 27, probe U): exit 2 with one line
naming the file or option, no traceback, nothing written. Each case failed before: a GPU benchmark that ran on the
CPU for hours, another script's figures rewritten with this one's merged in, NaN read from an input and printed as
a figure, and a run --exclude named left in the figures, each at exit 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.traces.helpers import REPO_ROOT, cli_error
from validation.error_stats import main as error_stats_main
from validation.fidelity_summary import main as fidelity_summary_main

LATENCIES = ["ttft_ms.p50", "ttft_ms.p90", "tpot_ms.p50", "tpot_ms.p90", "e2e_ms.p50", "e2e_ms.p90"]
CAPACITY_SPEED = REPO_ROOT / "benchmarks" / "results" / "capacity-speed-2026-12-01.json"
GPU_SUMMARY = REPO_ROOT / "validation" / "results" / "a-bench-nano" / "real_summary.json"
TIMEOUT_S = 60  # a refusal comes after the imports (torch's included); a script that started the work runs past it


def script_error(argv: list[str]) -> str:
    """Run a script as a user would: exit 2 and one error line, no traceback. Returns the line. In its own session,
    so that a script that starts the work instead is killed with what it started (engine replays, workers)."""
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{' '.join(argv)} still ran after {TIMEOUT_S} s: the input was not refused up front")
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


# --- benchmarks/serving.py without a GPU ------------------------------------------------------------------------------

def test_serving_without_a_gpu_says_so_instead_of_bisecting_on_the_cpu(tmp_path):
    """Every engine.replay probe fell back to the CPU with a note only: at the defaults (1,500 requests, five probes
    an engine) it ran for days, and a short run wrote the CPU's rates to --json as the engines' capacities."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    out = tmp_path / "r.json"
    line = script_error(["benchmarks/serving.py", "--num-requests", "3", "--warmup-requests", "0", "--probes", "1",
                         "--json", str(out)])
    assert line == "error: this benchmark times engine.replay on a CUDA GPU and found none"
    assert list(tmp_path.iterdir()) == []
    # A bad option is still named first, as on a GPU host.
    assert script_error(["benchmarks/serving.py", "--probes", "0"]) == (
        "error: --num-requests and --probes must be >= 1 and --warmup-requests >= 0")


# --- benchmarks/steady_capacity.py --json of another script -----------------------------------------------------------

def test_steady_capacity_refuses_another_scripts_figures_and_leaves_them(tmp_path):
    """capacity_speed's figures given as --json were kept, this script's parts merged among them and the file
    rewritten so (its cpu_count and python replaced by this run's), at exit 0."""
    path = tmp_path / "figures.json"
    shutil.copyfile(CAPACITY_SPEED, path)
    before = path.read_bytes()
    line = script_error(["benchmarks/steady_capacity.py", "--parts", "durations", "--durations", "5", "--jobs", "1",
                         "--json", str(path)])
    assert line == (f'error: --json {path}: holds no "trace": "traces/sharegpt.parquet" and "slo": '
                    '"ttft_p90=2s,tpot_p90=100ms" (its keys: num_simulations, num_configurations, num_jobs, '
                    "sweep_wall...); expected this script's figures or a new file")
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["figures.json"]


def test_steady_capacity_still_reads_its_own_figures():
    from benchmarks.steady_capacity import _load_figures
    from engine.core.config_args import OneLineErrorParser

    for path in sorted((REPO_ROOT / "benchmarks" / "results").glob("steady-capacity-*.json")):
        assert _load_figures(OneLineErrorParser(), str(path))["slo"] == "ttft_p90=2s,tpot_p90=100ms"


# --- NaN in the validation scripts' inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_band_check_refuses_a_gpu_summary_holding_nan_before_simulating(tmp_path, capsys, monkeypatch, value):
    """json reads NaN: the run was simulated, bands.md held "nan" and bands.json NaN (which is not JSON), at exit 0."""
    import cli.sim_replay
    from validation.band_check import main as band_check_main

    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: pytest.fail("simulated before reading the summaries"))
    summary = tmp_path / "a-bench-nano" / "real_summary.json"
    summary.parent.mkdir()
    text = GPU_SUMMARY.read_text()
    figure = json.loads(text)["tpot_ms"]["p90"]
    summary.write_text(text.replace(f'"p90": {figure}', f'"p90": {value}'))
    assert json.loads(summary.read_text())["tpot_ms"]["p90"] != figure  # the GPU's TPOT p90 is the bad one
    line = cli_error(band_check_main, ["--results", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    shown = "nan" if value == "NaN" else "inf"
    assert line == f"error: {summary}: tpot_ms.p90 is {shown}; expected a finite number (a GPU run's summary.json)"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field", ["gpu", "sim"])
def test_fidelity_summary_refuses_a_bands_json_holding_nan(tmp_path, capsys, field):
    """The table read "+nan%" for the figure, and the shape table's median and largest error took it in, at exit 0."""
    row = {"config": "b-azure-light", "run": "b-azure-light", "figure": "ttft_ms.p50", "gpu": 10.0, "sim": 11.0,
           "p5": 9.0, "median": 11.0, "p95": 12.0, "inside": True}
    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"bands": "20", "results": "x", "rows": [row, {**row, field: float("nan")}]}))
    out = tmp_path / "summary.md"
    line = cli_error(fidelity_summary_main, [str(path), "--out", str(out)], capsys)
    assert line == (f"error: {path}: not a bands.json of validation/band_check.py (rows[1] is "
                    f"{json.dumps({**row, field: float('nan')})[:80]}; expected config and figure (text), gpu and sim "
                    "(finite numbers or null) and inside (true, false or null))")
    assert [p.name for p in tmp_path.iterdir()] == ["bands.json"]


def _compare_json(folder, run: str, errors: list) -> None:
    (folder / run).mkdir(parents=True)
    (folder / run / "compare.json").write_text(json.dumps({"metrics": [{"key": k, "rel_error": e}
                                                                       for k, e in zip(LATENCIES, errors)]}))


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["NaN", "Infinity"])
def test_error_stats_refuses_a_relative_error_that_is_not_finite(tmp_path, capsys, value):
    """'mean nan %, largest nan %' for the label, at exit 0."""
    _compare_json(tmp_path, "b-azure-p70", [0.01, value, 0.01, 0.01, 0.01, 0.01])
    line = cli_error(error_stats_main, [f"x={tmp_path}"], capsys)
    assert line == (f"error: {tmp_path / 'b-azure-p70' / 'compare.json'}: the relative error of ttft_ms.p90 is "
                    f"{value}; expected a finite number")
    assert capsys.readouterr().out == ""


# --- validation/error_stats.py --exclude ------------------------------------------------------------------------------

@pytest.fixture
def two_runs(tmp_path):
    results = tmp_path / "results"
    _compare_json(results, "b-azure-p70", [0.01] * 6)
    _compare_json(results, "cal-azure", [0.5] * 6)
    return results


@pytest.mark.parametrize(("entry", "message"), [
    ("cal-azur", "no RESULTS_DIR given holds no cal-azur/compare.json; expected a run to leave out"),
    ("{tmp}/other:cal-azure", "{tmp}/other is none of the RESULTS_DIRs given; expected RUN or RESULTS_DIR:RUN"),
    ("{results}:cal-azur", "{results} holds no cal-azur/compare.json; expected a run to leave out"),
], ids=["a mistyped run", "another folder", "a mistyped run of a folder"])
def test_error_stats_refuses_an_exclude_that_names_no_run(tmp_path, capsys, two_runs, entry, message):
    """Each left the calibration run in the label's figures (here its 50 % errors) without a word, at exit 0."""
    entry = entry.format(tmp=tmp_path, results=two_runs)
    line = cli_error(error_stats_main, [f"x={two_runs}", "--exclude", f"b-azure-p70,{entry}"], capsys)
    assert line == f"error: --exclude {entry}: {message.format(tmp=tmp_path, results=two_runs)}"
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("spelling", ["{results}/", "{results}/../results", "./{relative}"],
                         ids=["a trailing slash", "through its parent", "relative"])
def test_error_stats_matches_an_excluded_folder_however_it_is_spelled(tmp_path, capsys, monkeypatch, two_runs,
                                                                      spelling):
    """RESULTS_DIR:RUN was matched as text: the folder spelled otherwise than in LABEL=RESULTS_DIR excluded nothing,
    and the calibration run's 50 % errors stayed in the figures at exit 0."""
    monkeypatch.chdir(tmp_path)
    where = spelling.format(results=two_runs, relative="results")
    assert error_stats_main([f"x={two_runs}", "--exclude", f"{where}:cal-azure"]) == 0
    assert capsys.readouterr().out == ("x: 1 runs; below saturation mean 1.0 %, median 1.0 %, largest 1.0 %, within "
                                       "3 %: 6 of 6, within 10 %: 6; ~95 % no runs\n")
