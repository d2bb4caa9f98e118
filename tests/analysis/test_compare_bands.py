"""analysis.compare against a simulation with prediction bands: whether each real figure lies inside its band,
as a column; tables without bands are as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.compare.cli import main as compare_main
from analysis.compare.error_table import error_table
from analysis.compare.tables import HEADERS, error_table_markdown, format_error_table
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT

REAL = {"ttft_ms.p50": 10.0, "ttft_ms.p90": 30.0, "output_throughput": 100.0, "num_preemptions": 3}
SIM = {"ttft_ms.p50": 11.0, "ttft_ms.p90": 20.0, "output_throughput": 90.0, "num_preemptions": 2}
BANDS = {"ttft_ms.p50": {"median": 11.0, "p5": 9.0, "p95": 14.0}, "ttft_ms.p90": {"median": 20.0, "p5": 18.0,
                                                                                   "p95": 25.0},
         "num_preemptions": {"median": 2, "p5": 1, "p95": 3}}


def test_rows_say_whether_the_real_figure_is_inside_the_band() -> None:
    rows = {row.key: row for row in error_table(REAL, SIM, BANDS)}
    assert rows["ttft_ms.p50"].in_band is True and rows["ttft_ms.p90"].in_band is False
    assert rows["num_preemptions"].in_band is True  # p95 itself is inside
    assert rows["output_throughput"].band is None and rows["output_throughput"].in_band is None
    assert rows["ttft_ms.p50"].to_dict()["band"] == BANDS["ttft_ms.p50"]
    assert "band" not in rows["output_throughput"].to_dict() and "in_band" not in rows["output_throughput"].to_dict()
    text = format_error_table(list(rows.values())).splitlines()
    assert text[0] == ("metric                       real    sim    diff  rel. error   sim p5 - p95  real in band")
    assert text[1] == ("TTFT p50 (ms)               10.00  11.00  +1.000    +10.00 %  9.000 - 14.00           yes")
    assert text[2] == ("TTFT p90 (ms)               30.00  20.00  -10.00    -33.33 %  18.00 - 25.00            no")
    assert text[17] == ("output throughput (tok/s)   100.0  90.00  -10.00    -10.00 %            n/a           n/a")
    assert [line for line in text if line.startswith("preemptions")][0].endswith("1 - 3           yes")
    markdown = error_table_markdown(list(rows.values())).splitlines()
    assert markdown[0].endswith("| rel. error | sim p5 - p95 | real in band |")
    assert markdown[2].endswith("| 9.000 - 14.00 | yes |")


def test_without_bands_the_table_is_unchanged() -> None:
    rows = error_table(REAL, SIM)
    assert format_error_table(rows).splitlines()[0].split("  ")[0] == "metric"
    assert "in band" not in format_error_table(rows) and "in band" not in error_table_markdown(rows)
    assert format_error_table(rows).splitlines()[0].split() == " ".join(HEADERS).split()
    assert all("band" not in row.to_dict() for row in rows)


def test_compare_a_real_run_against_a_simulation_with_bands(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = [str(SHAREGPT), "--limit", "60", "--qps", "6", "--quiet", "--no-report"]
    assert replay_main([*common, "--out", str(tmp_path / "real")]) == 0  # stands in for a GPU run
    assert replay_main([*common, "--out", str(tmp_path / "sim"), "--bands", "3"]) == 0
    capsys.readouterr()
    assert compare_main([str(tmp_path / "real"), str(tmp_path / "sim"), "--out", str(tmp_path / "cmp"),
                         "--no-report"]) == 0
    stdout = capsys.readouterr().out
    document = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    judged = [m for m in document["metrics"] if "in_band" in m]
    # Every latency statistic, both throughputs, the makespan, preemptions and the prefix-cache hit rate.
    assert len(judged) == 16 + 5
    num_inside = sum(m["in_band"] for m in judged)
    assert f"real inside the simulation's p5-p95 band: {num_inside} of 21 metrics" in stdout
    assert "| sim p5 - p95 | real in band |" in (tmp_path / "cmp" / "compare.md").read_text()
