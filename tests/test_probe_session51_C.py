"""Hostile input (session 51, helper C) to the surfaces of the last sessions:

- a profile's engine_features of another type ("true", 1, a list, null, NaN, an object) loaded at exit 0: the
  simulation recorded it and analysis.compare's engine notes and sim.calibrate's deployment check took it as not
  recorded; its fit's runs_decode_ahead edited apart from engine_features priced one engine and recorded another;
- validation/serving_probes.py simulated qwen3-0.6b whatever model serving.py's probes ran (its results' 'model'),
  and said nothing of the engine.replay options the probed engine ran with (--now-args);
- benchmarks/serving.py checked --now-args without the probe's own options: an abbreviation of one (--qp 500, which
  argparse takes for --qps) or an option that excludes one (--offline) passed, and failed the first probe;
- the validation scripts' check of a run given twice (sim.files.repeated_input_problem) compared paths only: a copy of
  a run folder (cp -r) had its steps counted twice at exit 0;
- a second Ctrl-C or SIGTERM while a command interrupted during its imports exited printed the line again and an
  'Exception ignored in atexit callback' traceback (analysis.capacity, traces.bench).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.profiled_cost_model import ProfiledCostModel
from tests.traces.helpers import cli_error

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "sim" / "profiles" / "h100" / "qwen3-8b.json"


def _profile_with(tmp_path: Path, features: object, fit_ahead: object = "keep") -> Path:
    profile = json.loads(SHIPPED.read_text())
    if features == "absent":
        del profile["engine_features"]
    else:
        profile["engine_features"] = features
    if fit_ahead != "keep":
        profile["fit"]["runs_decode_ahead"] = fit_ahead
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return path


FLAGS = {"prepares_decode_ahead": True, "runs_decode_ahead": True}


@pytest.mark.parametrize(("features", "fit_ahead", "detail"), [
    ("yes", "keep", "field 'engine_features' is \"yes\"; expected an object of what the profiled engine did "
                    "(prepares_decode_ahead, runs_decode_ahead, overlaps_decode_attention: true or false)"),
    ([1, 2], "keep", "field 'engine_features' is [1, 2]; expected an object"),
    (None, "keep", "field 'engine_features' is null; expected an object"),
    ({**FLAGS, "runs_decode_ahead": "true"}, "keep",
     "field 'engine_features.runs_decode_ahead' is \"true\"; expected true or false"),
    ({**FLAGS, "prepares_decode_ahead": 1}, "keep",
     "field 'engine_features.prepares_decode_ahead' is 1; expected true or false"),
    ({**FLAGS, "overlaps_decode_attention": "no"}, "keep",
     "field 'engine_features.overlaps_decode_attention' is \"no\"; expected true or false"),
    ({**FLAGS, "x": float("nan")}, "keep", "field 'engine_features.x' is NaN; expected true, false or a name"),
    ({**FLAGS, "x": {"a": [1]}}, "keep", "field 'engine_features.x' is {\"a\": [1]}; expected true, false or a name"),
    ({**FLAGS, "runs_decode_ahead": False}, "keep",
     "field 'fit.runs_decode_ahead' is true; expected field 'engine_features.runs_decode_ahead', false (refit it "
     "with python -m sim.fit_profile)"),
    ("absent", "keep", "field 'fit.runs_decode_ahead' is true; expected field 'engine_features.runs_decode_ahead', "
                       "false"),
    (FLAGS, "true", "field 'fit.runs_decode_ahead' is \"true\"; expected field 'engine_features.runs_decode_ahead', "
                    "true"),
])
def test_a_profiles_engine_features_are_flags_the_fit_agrees_with(tmp_path, features, fit_ahead, detail):
    path = _profile_with(tmp_path, features, fit_ahead)
    with pytest.raises(ValueError) as raised:
        ProfiledCostModel.load(path)
    assert str(raised.value).startswith(f"cost model {path}: not a readable profile ({detail}")


@pytest.mark.parametrize("features", [FLAGS, {**FLAGS, "overlaps_decode_attention": False, "sampler": "gumbel",
                                               "a_later_feature": True}])
def test_flags_and_names_load_and_are_recorded(tmp_path, features):
    model = ProfiledCostModel.load(_profile_with(tmp_path, features))
    assert model.engine_features == features and model.runs_decode_ahead is True


def test_a_profile_measured_before_the_features_loads_without_run_ahead(tmp_path):
    model = ProfiledCostModel.load(_profile_with(tmp_path, "absent", False))
    assert model.engine_features is None and model.runs_decode_ahead is False


def _serving():
    spec = importlib.util.spec_from_file_location("serving", REPO / "benchmarks" / "serving.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("now_args", "line"), [
    ("--qp 500", "error: --now-args: --qps is given twice; give it once (only the last value would count) (--help "
                 "lists the options)"),
    ("--lim=3", "error: --now-args: --limit is given twice; give it once (only the last value would count) (--help "
                "lists the options)"),
    ("--max-model 4096", "error: --now-args: --max-model-len is given twice; give it once (only the last value would "
                         "count) (--help lists the options)"),
    ("--offline", "error: --now-args: argument --offline: not allowed with argument --qps (--help lists the "
                  "options)"),
])
def test_now_args_are_checked_beside_the_probes_own_options(capsys, monkeypatch, now_args, line):
    serving = _serving()
    monkeypatch.setattr(serving, "cuda_available", lambda: True)  # refused before any GPU work, on a GPU host too
    monkeypatch.setattr(serving, "make_trace", lambda *a: pytest.fail("made the trace"))
    assert cli_error(serving.main, [f"--now-args={now_args}"], capsys) == line


def _probes_run(tmp_path: Path, **extra) -> tuple[subprocess.CompletedProcess, Path]:
    probe = {"qps": 5.0, "ttft_ms_p50": 25.0, "ttft_ms_p90": 50.0, "tpot_ms_p50": 10.0, "output_throughput": 1000.0,
             "met_slo": True}
    results = tmp_path / "serving.json"
    results.write_text(json.dumps({"trace": "traces/sharegpt.parquet", "num_requests": 50, "ttft_p90_ms_limit": 100.0,
                                   "runs": {"now": [probe], "before": []}, **extra}))
    out = tmp_path / "table.json"
    done = subprocess.run([sys.executable, str(REPO / "validation" / "serving_probes.py"), str(results), "--gpu",
                           "h100", "--json", str(out)], capture_output=True, text=True, cwd=REPO, timeout=600)
    return done, out


def test_serving_probes_simulates_the_model_the_probes_ran(tmp_path):
    done, out = _probes_run(tmp_path, model="qwen3-8b", engine_args={"before": [], "now": []})
    assert done.returncode == 0, done.stderr
    table = json.loads(out.read_text())
    assert table["model"] == "qwen3-8b" and table["cost_model"].startswith("profile:h100/qwen3-8b ")
    assert table["engine_args"] == []
    assert done.stdout.startswith("now engine's probes of qwen3-8b on the h100 ") and "note:" not in done.stdout


def test_serving_probes_notes_the_options_the_probed_engine_ran_with(tmp_path):
    done, out = _probes_run(tmp_path, engine_args={"before": [], "now": ["--overlap-decode-attention"]})
    assert done.returncode == 0, done.stderr
    assert ("note: the now engine ran engine.replay with --overlap-decode-attention, which this simulation does not "
            "replay: its figures are those of the profile's engine\n") in done.stdout
    table = json.loads(out.read_text())
    assert table["engine_args"] == ["--overlap-decode-attention"] and table["model"] == "qwen3-0.6b"  # serving.py's


@pytest.mark.parametrize(("extra", "line"), [
    ({"model": "nope"}, "'model' 'nope': model 'nope' is neither a directory with a config.json nor a shipped "
                        "config"),
    ({"model": 8}, "'model' is 8; expected the model serving.py's probes ran (its --model)"),
    ({"engine_args": {"now": "--overlap-decode-attention"}}, "'engine_args' is {'now': '--overlap-decode-attention'}; "
                                                             "expected each engine's extra engine.replay options"),
])
def test_serving_probes_refuses_a_bad_model_or_engine_args_in_one_line(tmp_path, extra, line):
    done, out = _probes_run(tmp_path, **extra)
    assert done.returncode == 2 and not out.exists()
    assert done.stderr.startswith(f"error: {tmp_path / 'serving.json'}: {line}"), done.stderr
    assert len(done.stderr.splitlines()) == 1


def _run_with_id(path: Path, run_id: str | None) -> Path:
    path.mkdir()
    summary = {"cost_model": "measured", **({"run_id": run_id} if run_id else {})}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_repeated_input_problem_sees_a_copy_of_a_run_by_its_run_id(tmp_path):
    from sim.files import repeated_input_problem

    run, copy = _run_with_id(tmp_path / "run", "0d48ea5f313d0dc2"), _run_with_id(tmp_path / "copy", "0d48ea5f313d0dc2")
    other, older = _run_with_id(tmp_path / "other", "1111111111111111"), _run_with_id(tmp_path / "older", None)
    assert repeated_input_problem([run, copy], "run folder") == (
        f"run folder {copy} holds the run {run} holds (run id 0d48ea5f313d0dc2, a copy); give each run once")
    assert repeated_input_problem([run, other, older, _run_with_id(tmp_path / "older2", None)], "run folder") is None
    assert repeated_input_problem([tmp_path / "none", run], "--calibration") is None  # named where it is read


def test_step_errors_refuses_a_copy_of_a_run(tmp_path):
    """cp -r RUN COPY: step_errors counted every step of the run twice, at exit 0."""
    from tests.test_probe_session50_B import PROFILE, _gpu_run, _one_line, _script

    run = _gpu_run(tmp_path / "run", 4)
    (run / "summary.json").write_text('{"cost_model": "measured", "run_id": "0d48ea5f313d0dc2"}\n')
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("steps.parquet", "summary.json"):
        (copy / name).write_bytes((run / name).read_bytes())
    line = _one_line(_script("step_errors", "--profile", str(PROFILE), str(run), str(copy)))
    assert line == f"error: run folder {copy} holds the run {run} holds (run id 0d48ea5f313d0dc2, a copy); give each " \
                   "run once"


_SECOND_SIGNAL_AT_EXIT = """
import atexit, os, signal, sys, time
sys.argv[0] = "-m"  # as runpy sets it while python -m imports a command's package
from engine.core import interrupt
interrupt.quiet_until_main()
atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))  # a second signal while the exit handlers run
{first}
time.sleep(30)
"""


@pytest.mark.parametrize("first", [
    # a SIGTERM while the package's modules import (analysis.capacity's numpy and polars)
    "os.kill(os.getpid(), signal.SIGTERM)",
    # a Ctrl-C while run_command imports the command's module (python -m traces.bench), under Python's handler
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "import importlib; importlib.import_module = lambda name: os.kill(os.getpid(), signal.SIGINT) or time.sleep(30)\n"
    "interrupt.run_command('cli.traces_bench')",
])
def test_a_second_signal_while_an_interrupted_command_exits_is_no_second_line_nor_traceback(first):
    done = subprocess.run([sys.executable, "-c", _SECOND_SIGNAL_AT_EXIT.format(first=first)], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    assert done.stderr == "interrupted: nothing written\n"
    assert done.returncode in (130, 143)  # the status of the first signal, or the second's: an exit, not a death
