"""Defects found by probing the trace tools with hostile input: each case failed before its fix."""

from __future__ import annotations

from tests.traces.helpers import cli_error
from traces.convert import main as convert_main


def test_convert_names_a_qps_too_small_in_its_own_terms(tmp_path, capsys):
    """--qps 1e-300 on a trace with recorded times was refused as "time scale 3.13077e+300 stretches the last arrival
    ... (a smaller scale or a larger qps)": traces.convert has no time scale to make smaller."""
    source = tmp_path / "azure.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n"
                      "2023-11-16 18:15:47.0,10,5\n")
    out = tmp_path / "out.parquet"
    line = cli_error(convert_main, ["azure", str(source), "--qps", "1e-300", "-o", str(out)], capsys)
    assert line == (f"error: {source} (converted from azure): qps 1e-300 is too small: it spreads the 2 requests "
                    "over 1e+300 s (the trace runs at 1 requests/s); expected at most 1e+12 s from the trace start to "
                    "its last arrival (a larger qps)")
    assert not out.exists()
