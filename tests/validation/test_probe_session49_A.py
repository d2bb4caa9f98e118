"""Forty-ninth session, helper A: validation/step_errors.py on a GPU run whose steps were logged as taking 0 s
divided a class's real time of 0 s (a ZeroDivisionError traceback); it now refuses the run as sim.calibrate does,
naming the file and the row."""

from __future__ import annotations

import polars as pl

from tests.sim.test_calibrate import _fake_run
from tests.traces.helpers import cli_error
from validation.step_errors import main as step_errors_main


def test_step_errors_refuses_steps_of_zero_seconds(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", host=1.3, decode=1.1)
    steps = run / "steps.parquet"
    pl.read_parquet(steps).with_columns(pl.lit(0.0).alias("duration_s")).write_parquet(steps)
    assert cli_error(step_errors_main, [str(run)], capsys) == (
        f"error: {steps}: row 0: column 'duration_s' is 0.0; expected a measured step time > 0 and at most 1e+12 s")


def test_step_errors_still_prices_a_measured_run(tmp_path, capsys):
    run = _fake_run(tmp_path / "run", host=1.3, decode=1.1)
    assert step_errors_main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "steps", "count", "real", "ms", "pred", "ms", "pred/real"]
    assert lines[-1].split()[:3] == ["run", "all", "70"]


def test_make_traces_refuses_an_out_inside_a_run_folder(tmp_path, capsys):
    """Its slices were written into the run folder before traces.synth refused the synthesised traces there."""
    from validation.make_traces import main as make_traces_main

    shared = tmp_path / "shared"
    shared.mkdir()
    for name in ("azure_llm_2023_conv.csv", "mooncake_conversation.jsonl"):
        (shared / name).write_text("not read: the refusal comes first\n")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        (run / name).write_bytes(b"a run's table")
    out = run / "traces"
    assert cli_error(make_traces_main, ["--shared", str(shared), "--out", str(out)], capsys) == (
        f"error: --out {out}: a trace written there is inside {run}, the output folder of an earlier command (it holds "
        "requests.parquet and steps.parquet); write the file beside it, not in it")
    assert sorted(p.name for p in run.iterdir()) == ["requests.parquet", "steps.parquet"]
