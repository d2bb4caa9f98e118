"""Hostile input to the validation scripts and the benchmarks probed less before (fidelity_summary, compare_all,
band_check, error_stats, host_episodes, loop_gaps, make_traces; server_loop, decode_real_batches, serving_overhead):
exit 2 with one line naming the file or option, no traceback, checked before any work, inputs never written over.
Each case failed before (a traceback, an exit 1, a silent wrong or empty result, or an input replaced or removed)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.traces.helpers import AZURE_2023, MOONCAKE, REPO_ROOT, cli_error, require
from validation import compare_all
from validation.band_check import main as band_check_main
from validation.error_stats import main as error_stats_main
from validation.fidelity_summary import main as fidelity_summary_main
from validation.host_episodes import main as host_episodes_main
from validation.loop_gaps import main as loop_gaps_main
from validation.make_traces import main as make_traces_main

RESULTS = REPO_ROOT / "validation" / "results"
BANDS = RESULTS / "machine-f-2026-12-03" / "bands-shipped" / "bands.json"
GPU_SUMMARY = RESULTS / "a-bench-nano" / "real_summary.json"
CONTEXTS = RESULTS / "machine-f-2026-12-03" / "probe" / "contexts.json"
LATENCIES = ["ttft_ms.p50", "ttft_ms.p90", "tpot_ms.p50", "tpot_ms.p90", "e2e_ms.p50", "e2e_ms.p90"]


def script_error(argv: list[str], timeout: int = 120) -> str:
    """Run a script as a user would: exit 2 and one error line, no traceback. Returns the line."""
    proc = subprocess.run([sys.executable, *argv], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


# --- fidelity_summary --out ---------------------------------------------------------------------------------------

def test_fidelity_summary_out_beside_its_bands_json_is_refused_and_the_input_kept(tmp_path, capsys):
    """--out bands.md beside the bands.json it read replaced that input with the summary's JSON, at exit 0."""
    bands = tmp_path / "bands.json"
    shutil.copyfile(BANDS, bands)
    before = bands.read_bytes()
    line = cli_error(fidelity_summary_main, [str(bands), "--out", str(tmp_path / "bands.md")], capsys)
    assert line == (f"error: --out {tmp_path / 'bands.md'}: its JSON {bands} is one of the inputs ({bands}); "
                    "write elsewhere")
    line = cli_error(fidelity_summary_main, [str(bands), "--out", str(bands)], capsys)
    assert line == f"error: --out {bands} is one of the inputs ({bands}); write elsewhere"
    assert bands.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["bands.json"]


@pytest.mark.parametrize(("out", "message"), [
    ("{tmp}", "--out {tmp} is a directory; expected a file path"),  # an IsADirectoryError traceback
    ("{tmp}/summary.json", "--out {tmp}/summary.json: the figures go beside it as {tmp}/summary.json; expected a name "
                           "not ending in .json (FILE.md)"),  # the table was overwritten by the JSON
    ("", "--out is empty; expected a file path"),  # nothing written, at exit 0
], ids=["a folder", "a .json", "empty"])
def test_fidelity_summary_refuses_an_out_it_cannot_write_whole(tmp_path, capsys, out, message):
    out = out.replace("{tmp}", str(tmp_path))
    line = cli_error(fidelity_summary_main, [str(BANDS), "--out", out], capsys)
    assert line == "error: " + message.replace("{tmp}", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_fidelity_summary_writes_both_files_into_a_new_folder(tmp_path, capsys):
    out = tmp_path / "new" / "summary.md"
    assert fidelity_summary_main([str(BANDS), "--out", str(out)]) == 0
    assert out.read_text() == capsys.readouterr().out
    assert sorted(json.loads(out.with_suffix(".json").read_text())) == ["by_load", "by_shape"]


@pytest.mark.parametrize("row", [{}, {"config": "b-azure-p70", "figure": "ttft_ms.p50", "gpu": "12", "sim": 1.0,
                                      "inside": True}], ids=["empty", "a string figure"])
def test_fidelity_summary_names_a_bad_row(tmp_path, capsys, row):
    """A KeyError or TypeError traceback."""
    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"rows": [row]}))
    line = cli_error(fidelity_summary_main, [str(path)], capsys)
    assert line.startswith(f"error: {path}: not a bands.json of validation/band_check.py (rows[0] is "), line


def test_fidelity_summary_refuses_a_bands_json_given_twice(tmp_path, capsys):
    """Its GPU runs counted twice in every figure, at exit 0."""
    bands = tmp_path / "bands.json"
    shutil.copyfile(BANDS, bands)
    line = cli_error(fidelity_summary_main, [str(bands), f"{tmp_path}/./bands.json"], capsys)
    assert line == f"error: {tmp_path}/./bands.json is given twice (also as {bands}); give each once"


# --- compare_all: never an output where the GPU runs are ----------------------------------------------------------

@pytest.mark.parametrize("option", ["--sim-out", "--results"])
def test_compare_all_refuses_outputs_in_the_gpu_runs_folder_and_leaves_them(tmp_path, capsys, monkeypatch, option):
    """--sim-out or --results given as --real removed each GPU run (shutil.rmtree) and wrote a simulation or a
    comparison in its place."""
    import cli.sim_replay

    calls = []
    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: calls.append(argv))
    real = tmp_path / "real"
    (real / "a-bench-nano").mkdir(parents=True)
    (real / "a-bench-nano" / "requests.parquet").write_bytes(b"the GPU run")
    others = {"--sim-out": tmp_path / "sim", "--results": tmp_path / "results"}
    others[option] = real
    argv = ["--real", str(real), *(x for name, path in others.items() for x in (name, str(path)))]
    line = cli_error(compare_all.main, argv, capsys)
    assert line == (f"error: {option} {real}: {real / 'a-bench-nano'} would replace the GPU run "
                    f"{real / 'a-bench-nano'}; expected a folder apart from --real {real}")
    assert (real / "a-bench-nano" / "requests.parquet").read_bytes() == b"the GPU run" and calls == []


def test_compare_all_with_host_timelines_and_only_offline_runs_writes_nothing(tmp_path, capsys):
    """Every run skipped (offline runs have no host timeline): an empty diagnosis/errors.md at exit 0."""
    real = tmp_path / "real"
    (real / "a-bench-nano").mkdir(parents=True)
    (real / "a-bench-nano" / "requests.parquet").write_bytes(b"the GPU run")
    argv = ["--real", str(real), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "results"),
            "--host-timelines"]
    line = cli_error(compare_all.main, argv, capsys)
    assert line == (f"error: --real {real}: no run to compare with --host-timelines (offline runs have no host "
                    "timeline); nothing written")
    assert not (tmp_path / "results" / "diagnosis" / "errors.md").exists()


# --- band_check ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "message"), [
    ("garbage", "not a readable summary.json (Expecting value"),
    ('{"config": {}}', "config.num_gpu_blocks is None; expected an integer >= 1"),
    ("[]", "config.num_gpu_blocks is None; expected an integer >= 1"),
], ids=["text", "no block count", "a list"])
def test_band_check_names_a_damaged_gpu_summary_before_simulating(tmp_path, capsys, monkeypatch, content, message):
    """A JSONDecodeError, KeyError or AttributeError traceback (after the simulations of the runs before it)."""
    import cli.sim_replay

    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: pytest.fail("simulated before reading the summaries"))
    (tmp_path / "a-bench-nano").mkdir()
    summary = tmp_path / "a-bench-nano" / "real_summary.json"
    summary.write_text(content)
    line = cli_error(band_check_main, ["--results", str(tmp_path), "--out", str(tmp_path / "out")], capsys)
    assert line.startswith(f"error: {summary}: {message}"), line
    assert not (tmp_path / "out").exists()


def test_band_check_refuses_an_out_that_is_a_file_before_simulating(tmp_path, capsys, monkeypatch):
    """A FileExistsError traceback after every simulation."""
    import cli.sim_replay

    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: pytest.fail("simulated before checking --out"))
    (tmp_path / "a-bench-nano").mkdir()
    shutil.copyfile(GPU_SUMMARY, tmp_path / "a-bench-nano" / "real_summary.json")
    (tmp_path / "file").write_text("x")
    line = cli_error(band_check_main, ["--results", str(tmp_path), "--out", str(tmp_path / "file")], capsys)
    assert line == f"error: --out {tmp_path / 'file' / 'bands.md'}: {tmp_path / 'file'} is a file, not a folder"
    assert (tmp_path / "file").read_text() == "x"


# --- error_stats --------------------------------------------------------------------------------------------------

def _compare_json(folder: Path, metrics) -> Path:
    (folder / "b-azure-p70").mkdir(parents=True, exist_ok=True)
    path = folder / "b-azure-p70" / "compare.json"
    path.write_text(metrics if isinstance(metrics, str) else json.dumps({"metrics": metrics}))
    return path


@pytest.mark.parametrize(("metrics", "message"), [
    ("garbage", "not a compare.json of analysis.compare (JSONDecodeError: Expecting value"),  # a traceback
    ("[1]", "not a compare.json of analysis.compare (TypeError"),  # a traceback
    ([{"key": k, "rel_error": "abc"} for k in LATENCIES], "the relative error of ttft_ms.p50 is abc; expected a "
                                                         "number"),  # a ValueError traceback
    ([], "no relative error for " + ", ".join(LATENCIES)),  # the same line at exit 1
], ids=["text", "a list", "a string error", "no figures"])
def test_error_stats_names_a_bad_compare_json_at_exit_2(tmp_path, capsys, metrics, message):
    path = _compare_json(tmp_path, metrics)
    line = cli_error(error_stats_main, [f"x={tmp_path}"], capsys)
    assert line.startswith(f"error: {path}: {message}"), line


def test_error_stats_refuses_a_folder_without_comparisons(tmp_path, capsys):
    """A mistyped folder (one above the results) printed '0 runs' at exit 0."""
    line = cli_error(error_stats_main, [f"x={tmp_path}"], capsys)
    assert line.startswith(f"error: {tmp_path}: no RUN/compare.json (expected a compare_all --results folder)"), line
    _compare_json(tmp_path, [{"key": k, "rel_error": 0.01} for k in LATENCIES])
    assert error_stats_main([f"x={tmp_path}"]) == 0
    assert capsys.readouterr().out.startswith("x: 1 runs; below saturation mean 1.0 %")


def test_error_stats_refuses_a_folder_given_twice_in_a_label(tmp_path, capsys):
    """Its runs counted twice in the label's figures, at exit 0."""
    _compare_json(tmp_path, [{"key": k, "rel_error": 0.01} for k in LATENCIES])
    spec = f"x={tmp_path},{tmp_path}/"
    line = cli_error(error_stats_main, [spec], capsys)
    assert line == f"error: {spec}: {tmp_path} is given twice; give each folder once"


# --- host_episodes and loop_gaps ----------------------------------------------------------------------------------

def _steps(num: int = 4, prefill: bool = True, **drop: bool) -> pl.DataFrame:
    """A small step log with --step-timings: alternating prefill and decode steps (decode only without prefill)."""
    frame = pl.DataFrame({
        "replica": [0] * num, "step": list(range(num)), "start_s": [0.01 * i for i in range(num)],
        "duration_s": [0.005] * num, "num_running": [2] * num, "num_waiting": [0] * num, "num_seqs": [2] * num,
        "num_finished": [0] * num, "num_decode_seqs": [2] * num,
        "num_prefill_tokens": [100 * (i % 2 == 0 and prefill) for i in range(num)],
        "host_launch_ms": [1.0] * num, "host_prepare_ms": [0.5] * num, "gpu_forward_ms": [3.0] * num,
    })
    return frame.drop([name for name in drop])


def _run(tmp_path: Path, steps: pl.DataFrame | bytes) -> Path:
    run = tmp_path / "diag" / "run"
    run.mkdir(parents=True)
    if isinstance(steps, bytes):
        (run / "steps.parquet").write_bytes(steps)
    else:
        steps.write_parquet(run / "steps.parquet")
    pl.DataFrame({"arrival_s": [0.0, 0.001]}).write_parquet(run / "requests.parquet")
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay's: a GPU run
    return run


@pytest.mark.parametrize("window", ["0", "-1", "nan", "inf"])
def test_host_episodes_refuses_a_window_that_is_not_a_finite_positive_number(tmp_path, capsys, window):
    """0, NaN and inf were an IndexError traceback; -1 printed a table of one window at exit 0."""
    run = _run(tmp_path, _steps())
    line = cli_error(host_episodes_main, [str(run.parent), f"--window-s={window}"], capsys)
    assert line == f"error: --window-s must be a finite number of seconds > 0, got {float(window)}"


def test_host_episodes_names_a_run_it_cannot_read_or_window(tmp_path, capsys):
    run = _run(tmp_path, _steps(prefill=False))  # no window with eager steps: an IndexError traceback
    line = cli_error(host_episodes_main, [str(run.parent)], capsys)
    assert line == (f"error: {run}: no 2-s window holds both eager and decode steps; nothing to compare (a longer "
                    "--window-s?)")
    _steps(gpu_forward_ms=True).write_parquet(run / "steps.parquet")  # a ColumnNotFoundError traceback
    line = cli_error(host_episodes_main, [str(run.parent)], capsys)
    assert line == (f"error: {run / 'steps.parquet'}: no column gpu_forward_ms; expected an engine.replay step log "
                    "with --step-timings")
    (run / "steps.parquet").write_bytes(b"not parquet")  # a polars traceback
    line = cli_error(host_episodes_main, [str(run.parent)], capsys)
    assert line.startswith(f"error: {run / 'steps.parquet'}: not a readable replay table ("), line


def test_loop_gaps_names_a_damaged_or_short_run_before_printing(tmp_path, capsys):
    good = _run(tmp_path / "good", _steps())
    run = _run(tmp_path, b"not parquet")  # a pyarrow traceback, after the runs before it were printed
    line = cli_error(loop_gaps_main, [str(good), str(run)], capsys)
    assert line.startswith(f"error: {run / 'steps.parquet'}: not a readable replay table ("), line
    assert capsys.readouterr().out == ""
    _steps(num_finished=True).write_parquet(run / "steps.parquet")
    line = cli_error(loop_gaps_main, [str(run)], capsys)
    assert line == f"error: {run / 'steps.parquet'}: no column num_finished; expected an engine.replay run's table"
    _steps(num=1).write_parquet(run / "steps.parquet")  # NaN figures at exit 0
    line = cli_error(loop_gaps_main, [str(run)], capsys)
    assert line.startswith(f"error: {run / 'steps.parquet'}: no step the engine went straight on from"), line
    assert loop_gaps_main([str(good)]) == 0 and "run" in capsys.readouterr().out


# --- make_traces --------------------------------------------------------------------------------------------------

@pytest.fixture
def shared_traces():
    return require(AZURE_2023).parent if require(MOONCAKE) else None


@pytest.mark.parametrize(("args", "message"), [
    (["--azure-start", "100000000"], "--azure-start 100000000 with --azure-count 6000: {azure} holds {n} requests; "
                                     "expected start + count <= {n}"),  # an IndexError traceback
    (["--azure-calibration-start", "{past}"], "--azure-calibration-start {past} with --azure-count 6000: {azure} "
                                              "holds {n} requests"),  # a short slice at exit 0
], ids=["past the end", "reaching past the end"])
def test_make_traces_refuses_a_slice_past_the_trace_before_writing(tmp_path, capsys, shared_traces, args, message):
    from traces.convert import ConvertOptions, convert

    num = len(convert("azure", AZURE_2023, ConvertOptions())[0])
    fill = {"{azure}": str(AZURE_2023), "{n}": str(num), "{past}": str(num - 100)}
    for key, value in fill.items():
        args, message = [a.replace(key, value) for a in args], message.replace(key, value)
    line = cli_error(make_traces_main, ["--shared", str(shared_traces), "--out", str(tmp_path / "out"), *args], capsys)
    assert line.startswith("error: " + message), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_make_traces_refuses_an_out_that_is_a_file(tmp_path, capsys, shared_traces, under):
    """A FileExistsError (NotADirectoryError) traceback."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "traces" if under else tmp_path / "file"
    line = cli_error(make_traces_main, ["--shared", str(shared_traces), "--out", str(out)], capsys)
    assert line == f"error: --out {out}: {tmp_path / 'file'} is a file; expected the folder the traces go to"
    assert (tmp_path / "file").read_text() == "x"


# --- benchmarks: server_loop, decode_real_batches, serving_overhead -----------------------------------------------

@pytest.mark.parametrize(("out", "message"), [
    ("{tmp}", "--json {tmp} is a directory; expected a file path"),  # an IsADirectoryError traceback after the runs
    ("", "--json is empty; expected a file path"),  # nothing written, at exit 0
], ids=["a folder", "empty"])
def test_server_loop_refuses_a_json_it_cannot_write_before_the_runs(tmp_path, out, message):
    argv = ["benchmarks/server_loop.py", "--requests", "1", "--max-tokens", "1", "--repeat", "1"]
    line = script_error([*argv, "--json", out.replace("{tmp}", str(tmp_path))])
    assert line == "error: " + message.replace("{tmp}", str(tmp_path))


def test_decode_real_batches_checks_its_files_before_asking_for_cuda(tmp_path):
    """OUT.json given as the contexts (the default's path) replaced them after the GPU run; a damaged contexts file
    was a traceback only on the GPU."""
    line = script_error(["benchmarks/decode_real_batches.py", str(CONTEXTS)])
    assert line == f"error: OUT.json {CONTEXTS} is one of the inputs ({CONTEXTS}); write elsewhere"
    contexts = tmp_path / "contexts.json"
    for content in ('[{"run": "r", "step": 1, "real_ms": 1.0, "contexts": []}]', "[]", "garbage"):
        contexts.write_text(content)
        line = script_error(["benchmarks/decode_real_batches.py", str(tmp_path / "out.json"), str(contexts)])
        assert line.startswith(f"error: {contexts}: "), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contexts.json"]


def test_serving_overhead_checks_its_options_before_the_runs(tmp_path):
    trace = tmp_path / "trace.parquet"
    shutil.copyfile(REPO_ROOT / "traces" / "sharegpt.parquet", trace)
    before = trace.read_bytes()
    (tmp_path / "file").write_text("x")
    base = ["benchmarks/serving_overhead.py", str(trace), "--qps", "1", "--limit", "2"]
    cases = [  # each ran the in-process replay (or the server) first
        (["--out-dir", str(tmp_path / "o"), "--json", str(trace)], f"--json {trace} is one of the inputs ({trace})"),
        (["--out-dir", str(tmp_path / "file"), "--json", str(tmp_path / "r.json")],
         f"--out-dir {tmp_path / 'file'}: {tmp_path / 'file'} is a file; expected a folder"),
    ]
    for args, message in cases:
        assert message in script_error([*base, *args])
    line = script_error([base[0], str(trace), "--qps", "-1", "--limit", "2", "--out-dir", str(tmp_path / "o"),
                         "--json", str(tmp_path / "r.json")])  # the child replay's CalledProcessError traceback
    assert line == "error: --qps must be a finite number > 0 and --limit >= 1, got -1 and 2"
    assert trace.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["file", "trace.parquet"]


def test_serving_overhead_names_a_failed_child_run_in_one_line(tmp_path):
    """A CalledProcessError traceback that did not say what the child said."""
    out = tmp_path / "o"
    line = script_error(["benchmarks/serving_overhead.py", str(REPO_ROOT / "traces" / "sharegpt.parquet"), "--qps",
                         "1", "--limit", "2", "--out-dir", str(out), "--json", str(tmp_path / "r.json"), "--cpu",
                         "--engine-args", "--block-size", "3"])
    assert line == (f"error: engine.replay exited with status 2: --block-size: block_size must be a power of two "
                    f"from 16 to 256, got 3 (its output: {out / 'inproc.log'})")
    assert not (tmp_path / "r.json").exists()


def test_throughput_without_a_gpu_says_so_instead_of_running_on_the_cpu_for_hours():
    """benchmarks/throughput.py ran the engine on the CPU without a word where no CUDA GPU was found (the default
    workload did not finish within minutes); --cpu still runs it there."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the benchmark runs on it")
    proc = subprocess.run([sys.executable, "benchmarks/throughput.py", "--num-seqs", "1"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == ("error: this benchmark times the engine on a CUDA GPU and found none; pass --cpu to run "
                           "it on the CPU anyway (slowly)\n")


def test_serving_overhead_names_why_the_server_did_not_start(tmp_path):
    """A server that did not start ended the script at status 1 with a line that was not an error line."""
    pytest.importorskip("fastapi")
    proc = subprocess.run([sys.executable, "benchmarks/serving_overhead.py", "traces/sharegpt.parquet", "--qps", "1",
                           "--limit", "2", "--skip-inproc", "--cpu", "--out-dir", str(tmp_path / "o"), "--json",
                           str(tmp_path / "o.json"), "--engine-args", "--max-num-seqs", "0"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == ("error: engine.serve did not start: --max-num-seqs: max_num_seqs must be an integer >= 1, "
                           f"got 0 (its output: {tmp_path / 'o' / 'serve.log'})\n")
    assert not (tmp_path / "o.json").exists()
