"""Forty-ninth session, helper A: analysis.summarize checks every folder's summary.json before it rewrites any (a
garbled one in the last folder named left the folders before it rewritten, at exit 2)."""

from __future__ import annotations

import polars as pl

from analysis.summarize import main as summarize_main
from cli.sim_replay import main as sim_replay_main
from tests.traces.helpers import cli_error


def _run(tmp_path, name):
    trace = tmp_path / "t.parquet"
    if not trace.exists():
        pl.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [30, 40],
                      "output_tokens": [3, 4]}).write_parquet(trace)
    out = tmp_path / name
    assert sim_replay_main([str(trace), "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def test_summarize_rewrites_nothing_when_a_later_summary_is_garbled(tmp_path, capsys):
    first, second = _run(tmp_path, "a"), _run(tmp_path, "b")
    (first / "summary.json").write_text((first / "summary.json").read_text() + "\n")  # the rewrite drops this line
    kept = (first / "summary.json").read_text()
    text = (second / "summary.json").read_text()
    (second / "summary.json").write_text(text[:40])
    assert cli_error(summarize_main, [str(first), str(second), "--quiet"], capsys).startswith(
        f"error: {second / 'summary.json'}: not valid JSON (")
    assert (first / "summary.json").read_text() == kept
    assert (second / "summary.json").read_text() == text[:40]

