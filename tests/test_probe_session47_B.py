"""Session 47 (helper B) hostile and unusual input for the simulator and the scripts run as files.

- A trace of Unix timestamps (arrival_s ~1.7e9: the schema takes up to 1e12 s) was simulated on that clock, where a
  float's step is 2.4e-7 s: each step's end was rounded so, the rounding piled up over a request's steps, and every
  request of a 200-request ShareGPT slice had another TTFT than the same trace counted from 0 s (up to 0.09 % off).
  Near the bound (2**39 s) the replay took 21 steps more, TTFTs were up to 34 % off and the median ITL 3 % (1.709
  against 1.659 ms), at exit 0. sim.replay now counts such a trace's arrivals from its first request (engine.replay
  refuses it and asks for that very shift), says so in one line and records the shift in summary.json's config.
- sim.calibrate and sim.host_speed said "RUN/steps.parquet: no steps.parquet" of a run whose steps.parquet is a
  folder (a copy gone wrong), which sent the user looking for a file that is there in name.
- The scripts run as files (validation/, benchmarks/) ended with a BrokenPipeError traceback and status 1 when their
  reader went away (``python validation/profile_diff.py A B | head -3``), as the commands did before session 26, and
  with an OSError traceback on a stdout that cannot be written (``>/dev/full``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from cli.sim_replay import main as replay_main
from sim.calibrate import main as calibrate_main
from sim.host_speed import main as host_speed_main
from tests.sim.test_calibrate import _fake_run
from tests.traces.helpers import cli_error
from traces.schema import load_trace, save_trace

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"
LATENCIES = ["ttft_s", "e2e_s", "queue_s", "tpot_s"]
PROFILES = [str(REPO / "sim" / "profiles" / gpu / "qwen3-0.6b.json") for gpu in ("h200", "h100")]
UNIX_S = 1.7e9  # 2026's Unix time; 1.7e9 + k / 8 is a float for every k below, so both traces hold the same gaps


def _trace_from(tmp_path: Path, name: str, first_s: float, num_requests: int = 60) -> Path:
    """The first ShareGPT requests, one every 1/8 s from ``first_s``."""
    source = load_trace(SHAREGPT).head(num_requests)
    frame = source.requests.with_columns((first_s + pl.int_range(pl.len()).cast(pl.Float64) / 8).alias("arrival_s"))
    path = tmp_path / f"{name}.parquet"
    save_trace(frame, path, hash_block_size=source.hash_block_size)
    return path


def _replay(trace: Path, out: Path, *extra: str) -> tuple[pl.DataFrame, dict]:
    assert replay_main([str(trace), "--out", str(out), "--quiet", "--no-report", *extra]) == 0
    return pl.read_parquet(out / "requests.parquet"), json.loads((out / "summary.json").read_text())


def _figures(summary: dict) -> dict:
    return {key: value for key, value in summary.items() if key not in ("trace", "config")}


@pytest.mark.parametrize("extra", [[], ["--qps", "20"], ["--time-scale", "0.5"]], ids=["as-is", "qps", "time-scale"])
def test_a_trace_of_unix_timestamps_is_simulated_as_the_same_trace_from_0(tmp_path, capsys, extra):
    requests, summary = _replay(_trace_from(tmp_path, "zero", 0.0), tmp_path / "zero", *extra)
    capsys.readouterr()
    unix = _trace_from(tmp_path, "unix", UNIX_S)
    unix_requests, unix_summary = _replay(unix, tmp_path / "unix", *extra)
    assert _figures(unix_summary) == _figures(summary)  # was: TTFT and queue figures off in their last digits
    assert unix_requests.select(LATENCIES).equals(requests.select(LATENCIES))
    assert unix_requests.equals(requests)  # every time, token times included, bit for bit
    assert pl.read_parquet(tmp_path / "unix" / "steps.parquet").equals(pl.read_parquet(tmp_path / "zero" /
                                                                                        "steps.parquet"))
    assert unix_summary["config"]["arrivals_counted_from_s"] == UNIX_S
    assert "arrivals_counted_from_s" not in summary["config"]
    assert capsys.readouterr().err == (
        f"note: {unix}: the first request arrives at 1700000000 s, more than 30 days from the trace's start (Unix "
        "timestamps?); arrival times are counted from it, so the run starts at 0 s\n")


def test_a_trace_near_the_arrival_bound_is_simulated_as_from_0(tmp_path, capsys):
    """2**39 s (5.5e11): a float's step is 1.2e-4 s there, 7 % of a 1.7 ms decode step."""
    requests, summary = _replay(_trace_from(tmp_path, "zero", 0.0, 30), tmp_path / "zero")
    far_requests, far_summary = _replay(_trace_from(tmp_path, "far", 2.0**39, 30), tmp_path / "far")
    assert far_summary["num_steps"] == summary["num_steps"]
    assert far_summary["itl_ms"] == summary["itl_ms"]
    assert far_requests.select(LATENCIES).equals(requests.select(LATENCIES))
    assert far_requests.equals(requests)


def test_a_first_arrival_within_30_days_keeps_the_traces_clock(tmp_path, capsys):
    """A trace that starts late (a slice of a longer one) is replayed on its own clock, as engine.replay replays it."""
    trace = _trace_from(tmp_path, "late", 30 * 24 * 3600.0, 5)
    requests, summary = _replay(trace, tmp_path / "late")
    assert requests["arrival_s"].to_list() == load_trace(trace).requests["arrival_s"].to_list()
    assert "arrivals_counted_from_s" not in summary["config"]
    assert capsys.readouterr().err == ""


def test_an_offline_replay_of_unix_timestamps_needs_no_note(tmp_path, capsys):
    requests, summary = _replay(_trace_from(tmp_path, "unix", UNIX_S, 5), tmp_path / "unix", "--offline")
    assert requests["arrival_s"].to_list() == [0.0] * 5
    assert "arrivals_counted_from_s" not in summary["config"]
    assert capsys.readouterr().err == ""


def test_a_steps_parquet_that_is_a_folder_is_named_so(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", host=1.2, decode=1.05)
    (run / "steps.parquet").unlink()
    (run / "steps.parquet").mkdir()
    profile = tmp_path / "p.json"
    profile.write_bytes(Path(PROFILES[0]).read_bytes())
    expected = f"error: {run}/steps.parquet: is not a regular file (expected an engine.replay output folder)"
    assert cli_error(calibrate_main, [str(profile), str(run)], capsys) == expected
    assert cli_error(host_speed_main, [str(run), "--profile", PROFILES[0], "--out", str(tmp_path / "h.csv")],
                     capsys) == expected
    (run / "steps.parquet").rmdir()
    assert cli_error(calibrate_main, [str(profile), str(run)], capsys) == (
        f"error: {run}/steps.parquet: no steps.parquet (expected an engine.replay output folder)")
    assert profile.read_bytes() == Path(PROFILES[0]).read_bytes()


def _script(stdout, *, close_stdout: bool = False) -> subprocess.CompletedProcess:
    process = subprocess.Popen([sys.executable, str(REPO / "validation" / "profile_diff.py"), *PROFILES], cwd=REPO,
                               stdout=stdout, stderr=subprocess.PIPE, text=True)
    if close_stdout:
        process.stdout.close()  # the reader is gone before the script prints a line
    stderr = process.stderr.read()
    return subprocess.CompletedProcess(process.args, process.wait(timeout=300), "", stderr)


def test_a_script_whose_reader_is_gone_ends_with_its_status():
    done = _script(subprocess.PIPE, close_stdout=True)
    assert done.stderr == ""  # was a BrokenPipeError traceback
    assert done.returncode == 0  # was 1


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_script_whose_stdout_is_full_says_so_in_one_line():
    with open("/dev/full", "w") as full:
        done = _script(full)
    assert done.stderr == ("error: cannot write to standard output (No space left on device); what the command "
                           "printed there is incomplete\n")  # was an OSError traceback
    assert done.returncode == 2  # was 1


def test_a_script_read_whole_prints_its_table():
    done = subprocess.run([sys.executable, str(REPO / "validation" / "profile_diff.py"), *PROFILES], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines()[0] == (f"B / A, median step times of 168 common grid points (A {PROFILES[0]}, B "
                                           f"{PROFILES[1]})")
