"""Forty-ninth session, helper A: traces.synth's errors name the option that set the bad value (a distribution's
error named no option; --turns 0 read "distribution '0': unknown kind '0'", which of --prompt-dist, --output-dist and
--turns left unsaid; a CV too large for a gamma gap did not say whether --cv or --think-time-cv)."""

from __future__ import annotations

import pytest

from tests.traces.helpers import cli_error
from traces.synth import main as synth_main


@pytest.mark.parametrize(("args", "expected"), [
    (["--prompt-dist", "foo"], "error: --prompt-dist: distribution 'foo': unknown kind 'foo'; expected one of fixed, "
     "uniform, lognormal, geometric, sharegpt (--help lists the options)"),
    (["--output-dist", "uniform:1,9"], "error: --output-dist: distribution 'uniform:1,9': expected key=value, got '1' "
     "(--help lists the options)"),
    (["--multi-turn", "--turns", "0"], "error: --turns: distribution '0': unknown kind '0'; expected one of fixed, "
     "uniform, lognormal, geometric, sharegpt (--help lists the options)"),
    (["--arrival", "gamma", "--cv", "1e300"], "error: --cv 1e+300 is too large (a gamma gap of mean 1.0 s with that "
     "coefficient of variation overflows) (--help lists the options)"),
    (["--multi-turn", "--think-time-cv", "1e300"], "error: --think-time-cv 1e+300 is too large (a gamma gap of mean "
     "30.0 s with that coefficient of variation overflows) (--help lists the options)"),
])
def test_synth_errors_name_the_option(tmp_path, capsys, args, expected):
    out = tmp_path / "s.parquet"
    assert cli_error(synth_main, ["-o", str(out), "--num-requests", "5", "--qps", "1", *args], capsys) == expected
    assert not out.exists()


def test_synth_multi_turn_gamma_starts_name_cv(tmp_path, capsys):
    """The sessions' starts draw their gaps elsewhere (traces.sessions): the same option named there."""
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "5", "--qps", "1", "--multi-turn", "--arrival", "gamma", "--cv", "1e300"]
    line = cli_error(synth_main, argv, capsys)
    assert line.startswith("error: --cv 1e+300 is too large (a gamma gap of mean ") and line.endswith(
        " s with that coefficient of variation overflows) (--help lists the options)"), line
    assert not out.exists()


def _run_folder(path):
    """A folder a replay wrote: the two tables that mark it (their content is not read)."""
    path.mkdir()
    for name in ("requests.parquet", "steps.parquet"):
        (path / name).write_bytes(b"a run's table")
    return path


@pytest.mark.parametrize("name", ["requests.parquet", "sub/trace.parquet", "trace.parquet"])
def test_synth_refuses_to_write_into_a_run_folder(tmp_path, capsys, name):
    """traces.synth -o RUN/requests.parquet --overwrite replaced the run's requests table with a trace (exit 0), and
    any other file made RUN a folder no run wrote whole (sim.replay --out RUN --overwrite then refused it)."""
    run = _run_folder(tmp_path / "run")
    argv = ["-o", str(run / name), "--num-requests", "5", "--qps", "1", "--overwrite"]
    assert cli_error(synth_main, argv, capsys) == (
        f"error: -o {run / name}: is inside {run}, the output folder of an earlier command (it holds requests.parquet "
        "and steps.parquet); write the file beside it, not in it")
    assert sorted(p.name for p in run.iterdir()) == ["requests.parquet", "steps.parquet"]
    assert (run / "requests.parquet").read_bytes() == b"a run's table"


def test_convert_refuses_to_write_into_a_comparison_folder(tmp_path, capsys):
    from traces.convert import main as convert_main

    source = tmp_path / "v.csv"
    source.write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    folder = tmp_path / "cmp"
    folder.mkdir()
    for name in ("compare.json", "compare.parquet"):
        (folder / name).write_text("{}")
    out = folder / "t.parquet"
    assert cli_error(convert_main, ["vidur", str(source), "-o", str(out), "--qps", "1"], capsys) == (
        f"error: -o {out}: is inside {folder}, the output folder of an earlier command (it holds compare.json and "
        "compare.parquet); write the file beside it, not in it")
    assert not out.exists()


def test_output_files_of_other_tools_are_held_to_the_same_rule(tmp_path):
    """sim.files.check_output_path, which sim.host_speed, validation/ and benchmarks/ check their files with."""
    from sim.files import check_output_path

    run = _run_folder(tmp_path / "run")
    assert check_output_path(str(run / "host.csv"), "--out", []) == (
        f"--out {run / 'host.csv'} is inside {run}, the output folder of an earlier command (it holds "
        "requests.parquet and steps.parquet); write the file beside it, not in it")
    assert check_output_path(str(tmp_path / "host.csv"), "--out", []) is None  # beside it
