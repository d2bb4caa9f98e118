"""Hostile input to sim.fit_profile, sim.calibrate, sim.host_speed and sim.profile: exit 2 with one line naming
the file, row or option, no traceback, no hang, no NaN written into a profile and no input overwritten."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.calibrate import main as calibrate_main
from sim.fit_profile import main as fit_main
from sim.host_speed import main as host_speed_main
from sim.profile import main as profile_main
from sim.profiled_cost_model import find_profile, write_profile
from tests.sim.helpers import REPO, save_tiny_qwen3
from tests.sim.test_calibrate import _fake_run
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")


def _profile(tmp_path, mutate=None):
    data = json.loads(PROFILE.read_text())
    if mutate:
        data = mutate(data)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def _set(path: str, value):
    def mutate(data):
        target = data
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value
        return data
    return mutate


BAD_PROFILES = {
    "a list": (lambda d: [], "top level is a JSON array"),
    "no points": (_set("points", []), "'points'"),
    "points an object": (_set("points", {}), "'points'"),
    "engine_options null": (_set("engine_options", None), "'engine_options'"),
    "three points": (lambda d: {**d, "points": d["points"][:3]}, "too few to fit"),
    "median NaN": (lambda d: _set("median_s", math.nan)(d["points"][0]) and d, "points\\[0\\]: 'median_s' is nan"),
    "median 0": (lambda d: _set("median_s", 0)(d["points"][0]) and d, "'median_s' is 0"),
    "median text": (lambda d: _set("median_s", "x")(d["points"][0]) and d, "'median_s' is 'x'"),
    "feature 2**70": (lambda d: _set("num_seqs", 2**70)(d["points"][0]["features"]) and d, "'num_seqs'"),
    # Each was a traceback at the end ("Out of range float values are not JSON compliant"), or a -1 copied on.
    "median 1e308": (lambda d: _set("median_s", 1e308)(d["points"][5]) and d, "points\\[5\\]: 'median_s' is 1e\\+308"),
    "host factor NaN": (_set("serving.host_factor", math.nan), "'serving.host_factor' is nan"),
    "decode factor inf": (_set("serving.decode_factor", math.inf), "'serving.decode_factor' is inf"),
    "host factor negative": (_set("serving.host_factor", -1), "'serving.host_factor' is -1"),
    # Read by sim.bands only: each was a traceback in every band replay (sim.replay --bands) or NaN bands.
    "repeat time text": (lambda d: _set("times_s", ["x"])(d["points"][2]) and d,
                         "points\\[2\\]: 'times_s' is \\['x'\\]"),
    "repeat time NaN": (lambda d: _set("times_s", [math.nan])(d["points"][2]) and d, "'times_s' is \\[nan\\]"),
    "episodes share beyond 1": (_set("serving.host_episodes.slow_share_range", [0.9, 2.0]),
                                "'serving.host_episodes.slow_share_range' is \\[0.9, 2.0\\]; expected \\[low, high\\], "
                                "0 <= low <= high < 1"),
    "episodes mean 0 s": (_set("serving.host_episodes.mean_episode_s", 0),
                          "'serving.host_episodes.mean_episode_s' is 0"),
    # Not fitted on, so refitted and written; sim.replay then failed with a traceback after the whole replay.
    "longest decode context text": (lambda d: _set("max_decode_context_tokens", "x")(d["points"][4]["features"]) and d,
                                    "points\\[4\\]: feature 'max_decode_context_tokens' is 'x'; expected an integer "
                                    "from 0 to 2\\*\\*53"),
    "calibration without decode factor": (lambda d: d["serving"].pop("decode_factor") and d,
                                          "field 'serving.decode_factor' is missing; expected a finite number > 0"),
    # Refitted and rewritten; every replay on it was then refused.
    "tensor parallel 0": (_set("tensor_parallel_size", 0),
                          "field 'tensor_parallel_size' is 0; expected an integer >= 1"),
    "no gpu": (lambda d: d.pop("gpu") and d, "field 'gpu' is missing"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_fit_profile_refuses_a_bad_profile_and_leaves_it_alone(tmp_path, capsys, case):
    mutate, pattern = BAD_PROFILES[case]
    path = _profile(tmp_path, mutate)
    before = path.read_bytes()
    line = cli_error(fit_main, [str(path)], capsys)
    assert str(path) in line
    assert re.search(pattern, line), line
    assert path.read_bytes() == before


def test_write_profile_refuses_a_non_finite_value_and_leaves_the_file(tmp_path):
    path = _profile(tmp_path)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: not written: .*NaN or infinite"):
        write_profile(path, {"fit": {"x": math.inf}})
    assert path.read_bytes() == before


@pytest.mark.parametrize("content", [b"\x88\xff binary", b""])
def test_fit_profile_unreadable_file(tmp_path, capsys, content):
    path = tmp_path / "p.json"
    path.write_bytes(content)
    assert str(path) in cli_error(fit_main, [str(path)], capsys)


def test_a_profile_nested_too_deeply_is_one_line(tmp_path, capsys):
    """Arrays nested thousands deep were a RecursionError traceback from the JSON reader of each tool."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')
    expected = f"error: {path}: JSON nested too deeply to read; expected a profile written by python -m sim.profile"
    assert cli_error(fit_main, [str(path)], capsys) == expected
    assert cli_error(calibrate_main, [str(path), str(run)], capsys) == expected
    out = tmp_path / "h.csv"
    line = cli_error(host_speed_main, [str(run), "--profile", str(path), "--out", str(out)], capsys)
    assert line == f"error: cost model {path}: not a readable profile (JSON nested too deeply to read)"
    assert not out.exists()
    # A run's summary.json nested as deep: calibrate tells it is unreadable instead of a traceback.
    (run / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    assert "has no readable summary.json" in cli_error(calibrate_main, [str(_profile(tmp_path)), str(run)], capsys)


def _run_with(tmp_path, name, mutate):
    run = _fake_run(tmp_path / name, host=1.5, decode=1.0)
    table = pq.read_table(run / "steps.parquet").to_pylist()
    mutate(table)
    pq.write_table(pa.Table.from_pylist(table), run / "steps.parquet")
    return run


@pytest.mark.parametrize(("value", "shown"), [(math.nan, "nan"), (-1.0, "-1.0"), (math.inf, "inf"), (None, "None")])
def test_calibrate_refuses_bad_step_durations(tmp_path, capsys, value, shown):
    """NaN or negative durations gave a host factor of 0.25 (the clamp) with exit 0; null a TypeError."""
    profile = _profile(tmp_path)
    before = profile.read_bytes()
    run = _run_with(tmp_path, "run", lambda rows: rows[0].update(duration_s=value))
    line = cli_error(calibrate_main, [str(profile), str(run)], capsys)
    assert f"{run / 'steps.parquet'}: row 0: column 'duration_s' is {shown}" in line
    assert profile.read_bytes() == before


@pytest.mark.parametrize(("mutate", "shown"), [
    (lambda rows: rows[3].update(duration_s=1e300), "row 3: column 'duration_s' is 1e+300; expected a measured step "
                                                    "time > 0 and at most 1e+12 s"),
    (lambda rows: [r.update(duration_s=0.0) for r in rows], "row 0: column 'duration_s' is 0.0"),
    (lambda rows: rows.__delitem__(slice(9, None)), "9 steps; expected at least 10 to calibrate on"),
])
def test_calibrate_refuses_absurd_or_too_few_steps(tmp_path, capsys, mutate, shown):
    """Each was accepted and written into the profile (a host factor at the 0.25 or 4 clamp)."""
    profile = _profile(tmp_path)
    before = profile.read_bytes()
    run = _run_with(tmp_path, "run", mutate)
    line = cli_error(calibrate_main, [str(profile), str(run)], capsys)
    assert f"{run / 'steps.parquet'}: {shown}" in line
    assert profile.read_bytes() == before


@pytest.mark.parametrize(("mutate", "shown"), [
    # A text 'step' sorted "10" before "2": wrong periods, and host factor 4.0 (the clamp) written at exit 0.
    (lambda rows: [r.update(step=str(r["step"])) for r in rows],
     "column 'step' has type string; expected integers from 0 to 2**53"),
    (lambda rows: rows[4].update(num_running=None), "row 4: column 'num_running' is None; expected an integer from 0 "
                                                    "to 2**53"),
    (lambda rows: rows[2].update(num_seqs=2**62), "row 2: column 'num_seqs' is 4611686018427387904; expected an "
                                                  "integer from 0 to 2**53"),
    (lambda rows: rows[5].update(start_s=1e300), "row 5: column 'start_s' is 1e+300; expected a finite number of "
                                                 "seconds from 0 to 2e+12"),
])
def test_calibrate_refuses_damaged_step_columns(tmp_path, capsys, mutate, shown):
    """Each was read as it was and calibrated the profile (to a clamped factor, or with nulls unseen) at exit 0."""
    profile = _profile(tmp_path)
    before = profile.read_bytes()
    run = _run_with(tmp_path, "run", mutate)
    assert cli_error(calibrate_main, [str(profile), str(run)], capsys) == f"error: {run / 'steps.parquet'}: {shown}"
    assert profile.read_bytes() == before


def test_calibrate_and_host_speed_name_a_repeated_column(tmp_path, capsys):
    """arrow's refusal quoted the whole schema over 25 lines, and named no file."""
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    table = pq.read_table(run / "steps.parquet")
    pq.write_table(table.append_column("duration_s", table.column("duration_s")), run / "steps.parquet")
    profile = _profile(tmp_path)
    expected = f"error: {run / 'steps.parquet'}: column 'duration_s' appears 2 times; expected each column once"
    assert cli_error(calibrate_main, [str(profile), str(run)], capsys) == expected
    out = tmp_path / "h.csv"
    assert cli_error(host_speed_main, [str(run), "--profile", str(profile), "--out", str(out)], capsys) == expected
    assert not out.exists()


def test_calibrate_on_too_few_steps_exits_2_in_a_child_process(tmp_path):
    """The error line came, then about every other run aborted at exit (status 134, 'terminate called without an
    active exception'): arrow's reader threads still held Python buffers of the file handle, and one released the
    last of them while the interpreter shut down. Three runs at once: each aborted with a chance of about a half."""
    run = _run_with(tmp_path, "run", lambda rows: rows.__delitem__(slice(9, None)))
    profile = _profile(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "sim.calibrate", str(profile), str(run)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        _, stderr = proc.communicate(timeout=60)
        assert (proc.returncode, stderr.splitlines()) == (
            2, [f"error: {run / 'steps.parquet'}: 9 steps; expected at least 10 to calibrate on"])


def test_calibrate_refuses_the_same_run_twice_and_a_bad_profile(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    profile = _profile(tmp_path)
    assert "given twice" in cli_error(calibrate_main, [str(profile), str(run), str(run) + "/"], capsys)
    bad = _profile(tmp_path, lambda d: [])
    assert str(bad) in cli_error(calibrate_main, [str(bad), str(run)], capsys)


@pytest.mark.parametrize(("serving", "shown"), [
    ("x", "field 'serving' is x; expected an object written by sim.calibrate"),
    ({"sessions": [1, 2]}, "field 'serving.sessions' is [1, 2]; expected a list of objects written by "
                           "sim.calibrate --add"),
    ({"host_factor": 1.0, "decode_factor": 1.0, "sessions": [{}]},
     "field 'serving.sessions[0].host_factor' is missing; expected a finite number > 0"),
    ({"sessions": [{"decode_factor": 1.0}]}, "field 'serving.sessions[0].host_factor' is missing"),
    ({"runs": "abc"}, "field 'serving.runs' is abc; expected a list of objects"),
    ({"host_episodes": {"slow_share_range": [0.5]}}, "field 'serving.host_episodes.slow_share_range' is [0.5]"),
])
def test_calibrate_add_refuses_a_malformed_calibration_and_leaves_the_profile(tmp_path, capsys, serving, shown):
    """--add keeps the profile's calibration and averages over it: each was a traceback (AttributeError, KeyError)
    after the runs were read."""
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    profile = _profile(tmp_path, _set("serving", serving))
    before = profile.read_bytes()
    assert cli_error(calibrate_main, [str(profile), str(run), "--add"], capsys).startswith(f"error: {profile}: {shown}")
    assert profile.read_bytes() == before
    assert calibrate_main([str(profile), str(run)]) == 0  # without --add it is replaced, so it need not be read


def _repeated(rows, times: int = 5) -> None:
    """The run ``times`` over, back to back: enough eager steps (150) for a host-speed timeline."""
    rows[:] = [{**r, "step": r["step"] + k * len(rows), "start_s": r["start_s"] + k} for k in range(times)
               for r in rows]


def test_host_speed_never_writes_over_its_inputs(tmp_path, capsys):
    """--out equal to --profile replaced the profile with the CSV, and --out RUN/summary.json (read to tell a GPU run
    from a simulated one) the run's summary."""
    run = _run_with(tmp_path, "run", _repeated)  # a run a timeline can be read from: the write would happen
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')
    profile = _profile(tmp_path)
    assert host_speed_main([str(run), "--profile", str(profile), "--out", str(tmp_path / "ok.csv")]) == 0
    before = {path: path.read_bytes() for path in (profile, run / "steps.parquet", run / "summary.json")}
    for out in before:
        line = cli_error(host_speed_main, [str(run), "--profile", str(profile), "--out", str(out)], capsys)
        assert "one of the inputs" in line
    assert {path: path.read_bytes() for path in before} == before


def test_host_speed_and_profile_replace_an_existing_file_only_when_asked(tmp_path, capsys):
    """Any existing file was replaced without a word: another run's requests.parquet, a trace, a measured profile."""
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')
    profile = _profile(tmp_path)
    precious = tmp_path / "precious.parquet"
    precious.write_bytes(b"PAR1 not to lose")
    argv = [str(run), "--profile", str(profile), "--out", str(precious)]
    assert cli_error(host_speed_main, argv, capsys) == (
        f"error: --out {precious} exists; pass --overwrite to replace it")
    assert precious.read_bytes() == b"PAR1 not to lose"
    assert host_speed_main([*argv, "--overwrite"]) == 0
    assert precious.read_text().startswith("start_s,slowdown")
    measured = tmp_path / "measured.json"
    measured.write_text("{}")
    assert cli_error(profile_main, ["--device", "cpu", "--out", str(measured)], capsys) == (
        f"error: --out {measured} exists; pass --overwrite to replace it")
    assert measured.read_text() == "{}"


@pytest.mark.parametrize("window", ["nan", "inf"])
def test_host_speed_window_must_be_finite(tmp_path, capsys, window):
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    argv = [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv"), "--window-s", window]
    assert "--window-s" in cli_error(host_speed_main, argv, capsys)


def test_host_speed_bad_out_fails_before_reading(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    for out, pattern in ((a_file / "h.csv", "not a folder"), (folder, "is a directory")):
        argv = [str(tmp_path / "no_run"), "--profile", str(PROFILE), "--out", str(out)]
        line = cli_error(host_speed_main, argv, capsys)
        assert line.startswith(f"error: --out {out}") and pattern in line


def test_host_speed_out_ending_in_a_slash_is_a_folder(tmp_path, capsys):
    """Path() dropped the '/': --out timelines/ wrote a file named 'timelines' at exit 0."""
    run = _run_with(tmp_path, "run", _repeated)  # a run a timeline can be read from: the write would happen
    out = f"{tmp_path / 'timelines'}/"
    line = cli_error(host_speed_main, [str(run), "--profile", str(PROFILE), "--out", out], capsys)
    assert line == f"error: --out {out} ends with '/', a folder; expected a file path"
    assert not (tmp_path / "timelines").exists()


def test_host_speed_names_what_a_profile_without_a_model_lacks(tmp_path, capsys):
    """A JSON object without 'model' (a run's summary.json given as --profile) was said to have model 'None'."""
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {"model": "qwen3-0.6b"}}))
    not_a_profile = tmp_path / "summary.json"
    not_a_profile.write_text(json.dumps({"config": {}}))
    argv = [str(run), "--profile", str(not_a_profile), "--out", str(tmp_path / "h.csv")]
    line = cli_error(host_speed_main, argv, capsys)
    assert "None" not in line and str(not_a_profile) in line and "field 'model' is missing" in line


def test_host_speed_bounds_the_number_of_windows(tmp_path, capsys):
    """Three eager steps 10^12 s in: one CSV row per 2-s window up to there would never finish."""
    def far(rows):
        _repeated(rows)
        for r in [r for r in rows if r["num_prefill_tokens"]][-3:]:
            r["start_s"] = 1e12
    run = _run_with(tmp_path, "run", far)
    argv = [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv")]
    line = cli_error(host_speed_main, argv, capsys)
    assert "windows" in line and "--window-s" in line


def test_host_speed_names_the_column_of_impossible_step_times(tmp_path, capsys):
    """Durations 1e300 times the grid's gave a bare 'host-speed timeline: every slowdown ...' naming no file."""
    def huge(rows):
        _repeated(rows)
        for r in rows:
            r["duration_s"] *= 1e300
    run = _run_with(tmp_path, "run", huge)
    line = cli_error(host_speed_main, [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv")], capsys)
    assert f"{run / 'steps.parquet'}: column 'duration_s'" in line and "expected 0.001 to 1000" in line
    assert not (tmp_path / "h.csv").exists()


def test_host_speed_refuses_a_simulated_run(tmp_path, capsys):
    """A sim.replay folder's step times are the cost model's: its 'host speed' would be the model's own."""
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").write_text(json.dumps({"cost_model": "profile:h200/qwen3-0.6b"}))
    line = cli_error(host_speed_main, [str(run), "--profile", str(PROFILE), "--out", str(tmp_path / "h.csv")], capsys)
    assert f"run folder {run} is a simulation" in line
    assert not (tmp_path / "h.csv").exists()


@pytest.mark.parametrize(("args", "pattern"), [
    (["--repeats", "0"], "--repeats"),  # IndexError after measuring the whole grid
    (["--repeats", str(2**70)], "--repeats must be an integer from 1 to 10,000"),  # measured one point forever
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--block-size", "3"], "--block-size"),
    (["--model", "no-such-model"], "--model no-such-model"),
    (["--gpu", ""], "--gpu"),
    (["--gpu", "h300"], "--gpu h300: unknown GPU; sim.replay --gpu knows h200, h100, a100-80g, l40s"),  # never matched
])
def test_profile_refuses_bad_options_before_loading(tmp_path, capsys, args, pattern):
    line = cli_error(profile_main, ["--device", "cpu", "--out", str(tmp_path / "p.json"), *args], capsys)
    assert pattern in line


def test_profile_refuses_an_unwritable_out_before_measuring(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    line = cli_error(profile_main, ["--device", "cpu", "--out", str(a_file / "p.json")], capsys)
    assert "--out" in line and "not a folder" in line


def test_profile_out_ending_in_a_slash_fails_before_measuring(tmp_path, capsys):
    """The measured grid was written to a file named as the folder the '/' asked for."""
    out = f"{tmp_path / 'profiles'}/"
    line = cli_error(profile_main, ["--device", "cpu", "--out", out], capsys)
    assert line == f"error: --out {out} ends with '/', a folder; expected a file path"
    assert not (tmp_path / "profiles").exists()


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_profile_that_is_not_a_regular_file_fails_at_once(tmp_path, capsys, kind):
    """A FIFO blocked fit_profile and calibrate forever; /dev/zero filled memory until the process was killed."""
    path = tmp_path / "p.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    expected = "is a directory; expected a file" if kind == "directory" else "not a regular file: a FIFO or a device"
    run = _fake_run(tmp_path / "run", host=1.5, decode=1.0)
    for main, argv in ((fit_main, [str(path)]), (calibrate_main, [str(path), str(run)])):
        assert cli_error(main, argv, capsys) == f"error: {path}: cannot read the profile ({expected})"


def test_calibrate_refuses_a_simulated_run(tmp_path, capsys):
    """Its step times are the cost model's own: the factors were fitted to the model and written at exit 0."""
    from cli.sim_replay import main as replay_main
    from tests.sim.helpers import SHAREGPT

    run = tmp_path / "sim"
    assert replay_main([str(SHAREGPT), "--limit", "20", "--quiet", "--no-report", "--out", str(run)]) == 0
    profile = _profile(tmp_path)
    before = profile.read_bytes()
    line = cli_error(calibrate_main, [str(profile), str(run)], capsys)
    assert line.startswith(f"error: run folder {run} is a simulation (cost model profile:h200/qwen3-0.6b")
    assert profile.read_bytes() == before


def test_ctrl_c_in_fit_profile_and_summarize_is_one_line(tmp_path, capsys, monkeypatch):
    """A KeyboardInterrupt traceback before; each file is written whole (beside it, then renamed) or not at all."""
    import analysis.summarize
    from analysis.summarize import main as summarize_main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    import sim.files

    # fit_profile is interrupted as it renames the refitted profile into place: the refit is written in full
    # beside the profile by then, so an in-place write would have changed it.
    monkeypatch.setattr(sim.files.os, "replace", interrupted)
    monkeypatch.setattr(analysis.summarize, "summarize_run_dir", interrupted)
    path = _profile(tmp_path)
    before = path.read_bytes()
    for main, argv in ((fit_main, [str(path)]), (summarize_main, [str(tmp_path)])):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 130
        assert capsys.readouterr().err == "interrupted: files finished before it are written, none in part\n"
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # nothing partial left beside it


SCRIPT_CASES = [  # (script and arguments, what the one error line says); each was a traceback or a wrong exit 0
    (["benchmarks/sim_million.py", "--requests", "100", "--router", "bogus"], "--router 'bogus': expected one of"),
    (["benchmarks/sim_million.py", "--requests", "100", "--json", "{tmp}"], "--json {tmp} is a directory"),
    (["benchmarks/server_loop.py", "--requests", "0"], "--requests must be >= 1, got 0"),
    (["benchmarks/throughput.py", "--num-seqs", "0"], "--num-seqs must be >= 1, got 0"),
    (["benchmarks/bench_client.py", "{tmp}/none.parquet"], "none.parquet: cannot read the trace: no such file"),
    (["benchmarks/serving_overhead.py", "{tmp}/none.parquet", "--qps", "1", "--limit", "5", "--out-dir", "{tmp}/o",
      "--json", "{tmp}/o.json"], "none.parquet: cannot read the trace: no such file"),
    (["benchmarks/steady_capacity.py", "--parts", "bogus"], "--parts 'bogus': expected a comma list"),
    (["benchmarks/kernels.py", "--sections", "bogus"], "--sections: unknown bogus"),
    (["benchmarks/step.py", "--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["benchmarks/steady_capacity.py", "--durations", "x"], "--durations 'x': expected a comma list of seconds"),
    (["validation/make_traces.py", "--shared", "{tmp}", "--out", "{tmp}/t"], "no azure_llm_2023_conv.csv"),
    (["validation/make_traces.py", "--azure-count", "-1", "--out", "{tmp}/t"], "--azure-count -1: expected"),
    (["benchmarks/sim_instructions.py", "--limit", "0"], "--limit must be >= 1, got 0"),
    (["benchmarks/sim_instructions.py", "--tree", "{tmp}"], "--tree: {tmp} holds no sim/simulator.py"),
    (["benchmarks/sim_instructions.py", "--qps", "nan"], "--qps must be a finite number > 0, got nan"),
    (["benchmarks/serving.py", "--before-range", "80,20"], "--before-range: expected 0 < LOW < HIGH, got '80,20'"),
    (["benchmarks/serving.py", "--json", "{tmp}/no/r.json"], "--json: the folder of {tmp}/no/r.json does not exist"),
    (["benchmarks/serving.py", "--before-tree", "{tmp}"], "--before-tree: {tmp} holds no engine/replay.py"),
    (["validation/step_errors.py", "{tmp}"], "no steps.parquet; expected an engine.replay run folder"),
    (["validation/step_errors.py", "{tmp}", "--batch-bin", "-1"], "--batch-bin: expected a number of sequences"),
    (["validation/step_errors.py", "{tmp}", "--context-bin", "-1"], "--context-bin: expected a number of tokens"),
    (["validation/loop_gaps.py", "{tmp}"], "no steps.parquet; expected an engine.replay run folder"),
    # Without runs these replaced the committed errors.md and bands.md with empty tables:
    (["validation/compare_all.py", "--real", "{tmp}", "--sim-out", "{tmp}/s", "--results", "{tmp}/r"],
     "no GPU run folder of the plan"),
    (["validation/band_check.py", "--results", "{tmp}", "--out", "{tmp}/b"], "no <run>/real_summary.json"),
]


@pytest.mark.parametrize(("argv", "message"), SCRIPT_CASES, ids=[" ".join(a[:2]) for a, _ in SCRIPT_CASES])
def test_benchmark_and_validation_scripts_refuse_bad_arguments(tmp_path, argv, message):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert lines and lines[-1].startswith("error: ") and message.replace("{tmp}", str(tmp_path)) in lines[-1], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written


def test_profile_without_cuda_is_one_line_unless_asked_for_the_cpu(tmp_path, capsys):
    """--device auto on a machine without CUDA measured the CPU for minutes, then ended in a traceback."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for device in ("auto", "cuda"):
        line = cli_error(profile_main, ["--device", device, "--out", str(tmp_path / "p.json")], capsys)
        assert line.startswith(f"error: --device {device}: sim.profile measures GPU step times")
        assert "--device cpu" in line
    assert not (tmp_path / "p.json").exists()


def test_profile_measures_only_the_grid_points_its_kv_blocks_hold(tmp_path, capsys, monkeypatch):
    """Each sequence holds whole blocks: a cache of few large blocks held fewer sequences than its token count said,
    and the first such grid point ended the run in 'RuntimeError: grid point does not fit the KV cache'."""
    pytest.importorskip("torch")
    from engine.gpu.model_runner import ModelRunner

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=20000)
    monkeypatch.setattr(ModelRunner, "_size_kv_cache", lambda self: 40)  # 40 blocks of 256 tokens, as a small CPU cache
    out = tmp_path / "profile.json"
    assert profile_main(["--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--repeats", "1",
                         "--max-model-len", "20000", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
                         "--out", str(out)]) == 0
    assert "grid points need more than the KV cache's 40 blocks of 256 tokens" in capsys.readouterr().err
    assert json.loads(out.read_text())["points"]


def test_host_speed_refuses_a_run_of_another_deployment(tmp_path, capsys):
    """A qwen3-8b run read against the qwen3-0.6b profile gave a timeline of the gap between the two models, written
    as if it were the host's speed; sim.calibrate refuses the same pair."""
    run = _run_with(tmp_path, "run", _repeated)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {"model": "qwen3-8b"}}))
    profile = _profile(tmp_path)
    out = tmp_path / "timeline.csv"
    line = cli_error(host_speed_main, [str(run), "--profile", str(profile), "--out", str(out)], capsys)
    assert line == (f"error: run folder {run} was recorded with model qwen3-8b, not the profile's qwen3-0.6b "
                    f"({profile}); give the profile of the run's deployment")
    assert not out.exists()


def test_a_json_value_is_named_in_json_words() -> None:
    """A profile or config that is JSON null was "a JSON NoneType"; a dict "a JSON dict"."""
    from engine.core.json_errors import json_type_name

    assert [json_type_name(v) for v in (None, {}, [], "", 1, 1.5, True)] == [
        "null", "object", "array", "string", "number", "number", "boolean"]
