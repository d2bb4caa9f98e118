"""analysis.summarize re-summarizes a replay folder without rewriting its tables or losing its metadata."""

from __future__ import annotations

import json
import os
import re

import polars as pl
import pytest

from analysis.summarize import main as summarize_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error


def test_resummarizing_keeps_tables_and_metadata(tmp_path):
    out = tmp_path / "run"
    assert replay_main([str(SHAREGPT), "--limit", "40", "--quiet", "--no-report", "--out", str(out)]) == 0
    tables = {name: (out / name).read_bytes() for name in ("requests.parquet", "steps.parquet")}
    before = json.loads((out / "summary.json").read_text())
    assert summarize_main([str(out), "--report", "--quiet"]) == 0
    after = json.loads((out / "summary.json").read_text())
    assert after == before  # config, cost_model and trace kept; the same metrics from the same tables
    assert {name: (out / name).read_bytes() for name in tables} == tables
    assert (out / "report.html").stat().st_size > 10_000
    assert not list(out.glob(".*partial"))


def _run(tmp_path):
    out = tmp_path / "run"
    assert replay_main([str(SHAREGPT), "--limit", "10", "--quiet", "--no-report", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(("summary", "pattern"), [
    ("[]", "the top level is a JSON array; expected an object"),
    ('{"config": NaN}', "'config' is nan; expected dict"),  # these two were AttributeError tracebacks
    ('{"config": [1, 2]}', "'config' is \\[1, 2\\]; expected dict"),
    ('{"warnings": [5]}', "warnings\\[0\\] is 5; expected an object with a 'code'"),
    # NaN was written back into summary.json (not JSON any more); -5 made every throughput negative
    ('{"recorded_duration_s": NaN}', "'recorded_duration_s' is nan; expected the run's duration, a number of seconds "
     "> 0 and at most 2e\\+12"),
    ('{"recorded_duration_s": -5}', "'recorded_duration_s' is -5; expected the run's duration"),
    ('{"recorded_duration_s": 0}', "'recorded_duration_s' is 0; expected the run's duration"),
    # Taken for "no SLOs", so the re-summary dropped the run's goodput without a word; the null a float() error.
    ('{"slos_ms": "ttft_p90=2s"}', 'slos_ms is "ttft_p90=2s"; expected an object of metric_statistic: limit in ms'),
    ('{"slos_ms": {"ttft_p90": null}}', "slos_ms entry 'ttft_p90' is null; expected a number of ms"),
    ('{"slos_ms": {"ttft_p90": "2000"}}', "slos_ms entry 'ttft_p90' is \"2000\"; expected a number of ms"),
    ('{"slos_ms": {"ttft_p90": -5}}', "slos_ms entry 'ttft_p90': SLO limit must be a finite number > 0 seconds"),
])
def test_a_hand_edited_summary_is_one_line_and_left_alone(tmp_path, capsys, summary, pattern):
    out = _run(tmp_path)
    (out / "summary.json").write_text(summary)
    line = cli_error(summarize_main, [str(out), "--quiet"], capsys)
    assert line.startswith(f"error: {out / 'summary.json'}: ") and re.search(pattern, line), line
    assert (out / "summary.json").read_text() == summary


@pytest.mark.parametrize(("summary", "expected"), [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read; expected the JSON a run writes"),  # traceback
    ('{"x": ' + "9" * 5000 + "}", "not valid JSON (a number of more than 4300 digits)"),  # Python's message alone
    (b"\xff\xfe{}", "not UTF-8 text (byte ff at 0); expected the JSON a run writes"),  # the codec's, no file
])
def test_an_unreadable_summary_is_one_line_naming_it(tmp_path, capsys, summary, expected):
    out = _run(tmp_path)
    path = out / "summary.json"
    path.write_bytes(summary if isinstance(summary, bytes) else summary.encode())
    before = path.read_bytes()
    assert cli_error(summarize_main, [str(out), "--quiet"], capsys) == f"error: {path}: {expected}"
    assert path.read_bytes() == before


def test_a_column_of_the_wrong_type_is_one_line_naming_the_file(tmp_path, capsys):
    """polars' cast error spans four lines."""
    out = _run(tmp_path)
    steps = pl.read_parquet(out / "steps.parquet").with_columns(pl.lit("x").alias("num_seqs"))
    steps.write_parquet(out / "steps.parquet")
    line = cli_error(summarize_main, [str(out), "--report", "--quiet"], capsys)
    assert line == (f"error: {out / 'steps.parquet'}: steps table: column 'num_seqs' holds String values that do not "
                    "convert to Int64")


@pytest.mark.parametrize(("table", "column", "value", "pattern"), [
    ("requests", "output_tokens", -1, "'output_tokens' is -1 at row 3; expected an integer >= 0"),
    ("requests", "finish_reason", "zzz", "'finish_reason' is 'zzz' at row 3; expected one of stop, length"),
    ("requests", "finish_s", -5.0, "'finish_s' is -5 at row 3; expected a time >= arrival_s"),
    ("steps", "duration_s", -1.0, "'duration_s' is -1 at row 3; expected a duration >= 0"),
    # These were summarized too: token times and the order of a request's events were not checked, nor a step's
    # counts and KV usage.
    ("requests", "token_times_s", [float("nan")], "'token_times_s' is nan at row 3; expected finite times"),
    ("requests", "token_times_s", [1e300], "'token_times_s' is 1e+300 at row 3; expected finite times within 2e+12"),
    ("requests", "first_token_s", -1.0, "'first_token_s' is -1 at row 3; expected a time >= arrival_s"),
    ("requests", "output_tokens", 2**62, "'output_tokens' is 4611686018427387904 at row 3; expected at most 2**40"),
    ("steps", "kv_usage", float("nan"), "'kv_usage' is nan at row 3; expected a share of the KV cache from 0 to 1"),
    ("steps", "num_running", -2, "'num_running' is -2 at row 3; expected an integer >= 0"),
])
def test_an_impossible_table_is_refused_and_left_alone(tmp_path, capsys, table, column, value, pattern):
    """Each was summarized with exit 0 as if measured."""
    out = _run(tmp_path)
    path = out / f"{table}.parquet"
    frame = pl.read_parquet(path)
    values = frame[column].to_list()
    values[3] = value
    frame.with_columns(pl.Series(column, values, dtype=frame.schema[column])).write_parquet(path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    line = cli_error(summarize_main, [str(out), "--quiet"], capsys)
    assert line.startswith(f"error: {path}: {table} table: column ") and pattern in line, line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize(("change", "pattern"), [
    (lambda times, finish, tokens: [*times[:-1], finish + 1.0],
     r"'token_times_s' is [0-9.e+]+ at row 3; expected a last token time <= finish_s \([0-9.e+]+\)"),
    (lambda times, finish, tokens: [times[0]] * (tokens + 2),
     r"'token_times_s' holds \d+ times at row 3; expected at most output_tokens \(\d+\)"),
], ids=["last token after the finish", "more token times than tokens"])
def test_token_times_past_the_finish_or_the_count_are_refused(tmp_path, capsys, change, pattern):
    """Both were summarized with exit 0 (and analysis.vllm_import wrote them from a result file)."""
    out = _run(tmp_path)
    path = out / "requests.parquet"
    frame = pl.read_parquet(path)
    values = frame["token_times_s"].to_list()
    values[3] = change(values[3], frame["finish_s"][3], frame["output_tokens"][3])
    frame.with_columns(pl.Series("token_times_s", values, dtype=frame.schema["token_times_s"])).write_parquet(path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    line = cli_error(summarize_main, [str(out), "--report", "--quiet"], capsys)
    assert line.startswith(f"error: {path}: requests table: column ") and re.search(pattern, line), line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("rows", ["one", "all"])
def test_null_token_times_are_read_as_none_recorded(tmp_path, rows):
    """A row without token times is summarized without ITLs of its own; a column of nothing but such rows was a
    NotImplementedError traceback ('Series of type Null does not have lt operator') from the order check."""
    out = _run(tmp_path)
    path = out / "requests.parquet"
    frame = pl.read_parquet(path)
    values = frame["token_times_s"].to_list()
    values = [None if rows == "all" or i == 3 else v for i, v in enumerate(values)]
    frame.with_columns(pl.Series("token_times_s", values, dtype=pl.List(pl.Float64))).write_parquet(path)
    assert summarize_main([str(out), "--quiet"]) == 0
    itl = json.loads((out / "summary.json").read_text())["itl_ms"]
    assert (itl["mean"] is None) == (rows == "all")


def test_report_html_that_is_a_link_is_replaced_not_followed(tmp_path):
    """--report wrote through a report.html linked to another file, overwriting that file."""
    out = _run(tmp_path)
    target = tmp_path / "precious.txt"
    target.write_text("not a report\n")
    (out / "report.html").symlink_to(target)
    assert summarize_main([str(out), "--report", "--quiet"]) == 0
    assert target.read_text() == "not a report\n"
    assert not (out / "report.html").is_symlink() and (out / "report.html").stat().st_size > 10_000
    assert not list(out.glob(".*partial*"))


def test_report_html_that_is_a_folder_is_refused_before_writing(tmp_path, capsys):
    out = _run(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (out / "report.html").symlink_to(tmp_path / "elsewhere")
    before = (out / "summary.json").read_bytes()
    line = cli_error(summarize_main, [str(out), "--report", "--quiet"], capsys)
    assert line.startswith(f"error: {out / 'report.html'}: is a folder or not a regular file"), line
    assert (out / "summary.json").read_bytes() == before and not list((tmp_path / "elsewhere").iterdir())


def test_a_table_that_is_not_a_file_is_named_so(tmp_path, capsys):
    out = _run(tmp_path)
    (out / "requests.parquet").unlink()
    os.mkfifo(out / "requests.parquet")
    line = cli_error(summarize_main, [str(out), "--quiet"], capsys)
    assert line == f"error: {out / 'requests.parquet'} is not a regular file"  # said "does not exist"
