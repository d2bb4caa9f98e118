"""Session 47 (helper D) hostile and unusual input, second round: the simulator, analysis and validation scripts.

- validation/step_errors.py, loop_gaps.py, decode_fits.py and host_episodes.py read a sim.replay folder as a GPU run:
  its step times are the cost model's own, so every ratio printed 1.000 (and loop_gaps a 0.0 us loop) at exit 0.
  They now refuse it as sim.calibrate and sim.host_speed did, through one check (sim.run_kind.gpu_run_problem),
  and a run timed by a client too (its empty step log was an empty step_errors table at exit 0).
- validation/compare_all.py --real given a folder of simulations simulated each again and compared it with itself.
- sim.replay --router lor and analysis.capacity --router lor with one replica recorded a router that changes
  nothing, without a word: a note on stderr now says so (scripts pass --router whatever --replicas they give).
- A run in which no time passed (one rejected request) had request throughput null beside goodput 0.0 req/s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.metrics import summarize
from analysis.report.summary_table import format_summary_table
from analysis.slo import parse_slos
from cli.sim_replay import main as replay_main
from tests.traces.helpers import cli_error
from traces.schema import load_trace, save_trace
from validation import compare_all
from validation.decode_fits import main as decode_fits_main
from validation.host_episodes import main as host_episodes_main
from validation.loop_gaps import main as loop_gaps_main
from validation.step_errors import main as step_errors_main

REPO = Path(__file__).resolve().parents[1]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"
ROUTER_NOTE = ("note: --router lor: with --replicas 1 every request goes to the one replica, so the router changes "
               "nothing (the run is the same with any router)\n")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    """A sim.replay folder of 20 ShareGPT requests."""
    out = tmp_path_factory.mktemp("sim") / "run"
    assert replay_main([str(SHAREGPT), "--limit", "20", "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def _validation_argv(script: str, run: Path) -> tuple:
    return {"step_errors": (step_errors_main, [str(run)]),
            "loop_gaps": (loop_gaps_main, [str(run)]),
            "decode_fits": (decode_fits_main, [str(run), "--calibration", str(run)]),
            "host_episodes": (host_episodes_main, [str(run.parent)])}[script]


def _tables_of(simulated: Path, run: Path, steps_logged: bool = True) -> Path:
    """A folder ``run`` with the simulated run's requests.parquet and steps.parquet (with no step where not
    ``steps_logged``, as a client-timed run has), without its summary.json."""
    run.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        (run / name).write_bytes((simulated / name).read_bytes())
    if not steps_logged:
        pl.read_parquet(simulated / "steps.parquet").head(0).write_parquet(run / "steps.parquet")
    return run


@pytest.mark.parametrize("script", ["step_errors", "loop_gaps", "decode_fits", "host_episodes"])
def test_validation_scripts_refuse_a_simulated_run(simulated, capsys, script):
    main, argv = _validation_argv(script, simulated)
    cost_model = json.loads((simulated / "summary.json").read_text())["cost_model"]
    assert cost_model.startswith("profile:h200/qwen3-0.6b")
    assert cli_error(main, argv, capsys) == (
        f"error: run folder {simulated} is a simulation (cost model {cost_model}); give engine.replay (GPU) runs, "
        "whose steps.parquet holds the GPU's step times")


@pytest.mark.parametrize("script", ["step_errors", "loop_gaps", "decode_fits"])
def test_validation_scripts_refuse_a_run_without_its_summary(simulated, tmp_path, capsys, script):
    """The summary is what tells a GPU run from a simulation: a simulated run without it is not read as a GPU's."""
    run = _tables_of(simulated, tmp_path / "run")
    main, argv = _validation_argv(script, run)
    assert cli_error(main, argv, capsys) == (
        f"error: run folder {run} has no readable summary.json; expected an engine.replay output folder (its "
        "summary.json tells a GPU run from a simulation)")


@pytest.mark.parametrize("script", ["step_errors", "loop_gaps", "decode_fits"])
def test_validation_scripts_refuse_a_run_timed_by_a_client(simulated, tmp_path, capsys, script):
    """An imported vllm bench serve result logs no engine step: step_errors printed an empty table at exit 0."""
    run = _tables_of(simulated, tmp_path / "run", steps_logged=False)
    (run / "summary.json").write_text('{"cost_model": "vllm bench serve (client-side timing)"}\n')
    main, argv = _validation_argv(script, run)
    assert cli_error(main, argv, capsys) == (
        f"error: run folder {run} was timed by a client (vllm bench serve (client-side timing)) and logged no engine "
        "steps; give engine.replay (GPU) runs, whose steps.parquet holds the GPU's step times")


def test_compare_all_refuses_a_simulation_among_the_gpu_runs(simulated, tmp_path, capsys, monkeypatch):
    """--real given the simulations' folder: each was simulated again and compared with itself (0 % errors)."""
    import cli.sim_replay

    calls = []
    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: calls.append(argv))
    real = tmp_path / "real"
    shutil.copytree(simulated, real / "a-bench-nano")
    cost_model = json.loads((simulated / "summary.json").read_text())["cost_model"]
    argv = ["--real", str(real), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "results")]
    assert cli_error(compare_all.main, argv, capsys) == (
        f"error: --real {real}: run folder {real / 'a-bench-nano'} is a simulation (cost model {cost_model}); give "
        "engine.replay (GPU) runs, whose steps.parquet holds the GPU's step times")
    assert calls == [] and not (tmp_path / "sim").exists() and not (tmp_path / "results").exists()


def test_step_errors_still_reads_a_gpu_run(simulated, tmp_path, capsys):
    """The same tables under a GPU run's summary are read (a check that refused every folder would pass above)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        (run / name).write_bytes((simulated / name).read_bytes())
    (run / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay writes it
    assert step_errors_main([str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].split()[:2] == ["run", "all"]
    assert loop_gaps_main([str(run)]) == 0


def test_sim_replay_notes_a_router_that_one_replica_makes_moot(tmp_path, capsys):
    base = [str(SHAREGPT), "--limit", "5", "--quiet", "--no-report"]
    assert replay_main([*base, "--out", str(tmp_path / "lor"), "--router", "lor"]) == 0
    assert capsys.readouterr().err == ROUTER_NOTE
    assert json.loads((tmp_path / "lor" / "summary.json").read_text())["config"]["router"] == "lor"  # as given
    assert replay_main([*base, "--out", str(tmp_path / "two"), "--router", "lor", "--replicas", "2"]) == 0
    assert capsys.readouterr().err == ""  # it routes between two
    assert replay_main([*base, "--out", str(tmp_path / "rr"), "--router", "rr"]) == 0
    assert capsys.readouterr().err == ""  # the default: nothing was asked of it


def test_capacity_notes_a_router_that_one_replica_makes_moot(tmp_path, capsys):
    quick = [str(SHAREGPT), "--slo", "ttft_p90=2s", "--max-iterations", "1", "--no-duration-check",
             "--min-duration-s", "10", "--min-requests", "20", "--jobs", "1", "--quiet"]
    assert capacity_main([*quick, "--router", "lor", "--out", str(tmp_path / "one")]) == 0
    assert capsys.readouterr().err == ROUTER_NOTE
    assert capacity_main([*quick, "--router", "lor", "--replicas", "1,2", "--out", str(tmp_path / "two")]) == 0
    assert "--router" not in capsys.readouterr().err  # the two-replica configuration routes


def test_a_run_in_which_no_time_passed_has_no_goodput(tmp_path, capsys):
    """One request that can never fit, rejected on arrival: duration 0 s, request throughput null, and goodput was
    0.000 req/s beside it, a measured rate the run never had."""
    source = load_trace(SHAREGPT)
    frame = source.requests.head(1).drop("hash_ids").with_columns(prompt_tokens=30_000)
    trace = tmp_path / "huge.parquet"
    save_trace(frame, trace)
    out = tmp_path / "out"
    assert replay_main([str(trace), "--out", str(out), "--no-report", "--max-model-len", "20000",
                        "--slo", "ttft_p90=1s"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_rejected"], summary["duration_s"]) == (1, 0.0)
    assert summary["request_throughput"] is None and summary["goodput"] is None
    assert summary["request_goodput"] is None
    assert "goodput                 -\n" in capsys.readouterr().out
    requests = pl.read_parquet(out / "requests.parquet")  # the same from the tables, as analysis.summarize reads them
    assert summarize(requests, None, slos=parse_slos("ttft_p90=1s"))["goodput"] is None


def test_a_run_over_time_keeps_a_goodput_of_zero(tmp_path):
    """Time passed and no request met the SLOs: that is a measured 0, as before."""
    out = tmp_path / "out"
    assert replay_main([str(SHAREGPT), "--limit", "5", "--out", str(out), "--quiet", "--no-report",
                        "--slo", "ttft_p90=0.001ms"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["duration_s"] > 0 and summary["goodput"] == 0.0 == summary["request_goodput"]
    assert format_summary_table(summary).count("goodput                 0.000 req/s") == 1
