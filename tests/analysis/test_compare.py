"""Sim-vs-real error table and per-request join on small hand-made runs with known errors."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analysis.compare.comparison import compare_runs, config_differences, markdown_document
from analysis.compare.error_table import METRIC_SPECS, error_table, relative_error, run_metrics
from analysis.compare.inputs import CompareInputError, load_run
from analysis.compare.request_join import NoCommonRequestsError, join_requests
from analysis.compare.tables import error_table_markdown, format_error_table
from analysis.formatting import format_float
from tests.analysis.frames import requests_frame, steps_frame

TTFT_SCALE = 1.1  # the simulated run's TTFTs are 10 % higher than the real run's


def real_requests() -> pl.DataFrame:
    """Three finished requests: TTFT 100/200/300 ms, TPOT 100/200/300 ms, E2E 300/600/900 ms."""
    rows = []
    for index in range(3):
        arrival_s = float(index)
        ttft_s = 0.1 * (index + 1)
        gap_s = 0.1 * (index + 1)
        token_times_s = [arrival_s + ttft_s + gap_s * k for k in range(3)]
        rows.append(dict(request_id=f"r{index}", arrival_s=arrival_s, first_scheduled_s=arrival_s,
                         first_token_s=token_times_s[0], finish_s=token_times_s[-1], output_tokens=3,
                         prompt_tokens=100, cached_tokens=50 if index == 1 else 0, token_times_s=token_times_s))
    return requests_frame(rows)


def sim_requests() -> pl.DataFrame:
    """The real requests with 10 % more TTFT (same decode gaps), 2 preemptions and more cache hits."""
    rows = []
    for row in real_requests().iter_rows(named=True):
        shift_s = (row["first_token_s"] - row["arrival_s"]) * (TTFT_SCALE - 1)
        times = [t + shift_s for t in row["token_times_s"]]
        rows.append({**row, "first_token_s": times[0], "finish_s": times[-1], "token_times_s": times})
    rows[1]["cached_tokens"] = 100
    rows[2]["num_preemptions"] = 2
    return requests_frame(rows)


def real_steps() -> pl.DataFrame:
    return steps_frame([dict(start_s=0.1 * i, duration_s=0.1 * (i + 1), num_seqs=1, num_batched_tokens=10)
                        for i in range(3)])


def sim_steps() -> pl.DataFrame:
    durations_s = [0.1, 0.2, 0.3, 0.2]
    return steps_frame([dict(start_s=0.1 * i, duration_s=d, num_seqs=1, num_batched_tokens=10)
                        for i, d in enumerate(durations_s)])


def write_run(path: Path, requests: pl.DataFrame, steps: pl.DataFrame, summary: dict | None = None) -> Path:
    """A replay folder as the replay CLIs write it (summary.json only carries context here)."""
    path.mkdir(parents=True, exist_ok=True)
    requests.write_parquet(path / "requests.parquet")
    steps.write_parquet(path / "steps.parquet")
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def write_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The hand-made real and sim folders used across the comparison tests."""
    real = write_run(tmp_path / "real", real_requests(), real_steps(),
                     {"config": {"max_num_seqs": 256, "model": "m"}})
    sim = write_run(tmp_path / "sim", sim_requests(), sim_steps(),
                    {"cost_model": "roofline-estimate", "config": {"max_num_seqs": 8, "model": "m",
                                                                   "simulator_wall_s": 0.1}})
    return real, sim


def rows_by_key(real: pl.DataFrame, sim: pl.DataFrame, real_st: pl.DataFrame, sim_st: pl.DataFrame) -> dict:
    return {row.key: row for row in error_table(run_metrics(real, real_st)[1], run_metrics(sim, sim_st)[1])}


def test_relative_error_is_signed_and_undefined_without_a_real_value() -> None:
    assert relative_error(200.0, 220.0) == pytest.approx(0.10)
    assert relative_error(200.0, 180.0) == pytest.approx(-0.10)
    assert relative_error(0, 3) is None
    assert relative_error(None, 3.0) is None
    assert relative_error(3.0, None) is None


def test_error_table_has_exact_signed_errors() -> None:
    rows = rows_by_key(real_requests(), sim_requests(), real_steps(), sim_steps())
    assert [row.key for row in rows.values()] == [spec.key for spec in METRIC_SPECS]
    for stat in ("p50", "p90", "p99", "mean"):
        assert rows[f"ttft_ms.{stat}"].rel_error == pytest.approx(0.10, abs=1e-9)
        assert rows[f"tpot_ms.{stat}"].rel_error == pytest.approx(0.0, abs=1e-9)
        assert rows[f"itl_ms.{stat}"].rel_error == pytest.approx(0.0, abs=1e-9)
    ttft_p50 = rows["ttft_ms.p50"]
    assert (ttft_p50.real, ttft_p50.sim, ttft_p50.diff) == pytest.approx((200.0, 220.0, 20.0))
    assert ttft_p50.title == "TTFT p50 (ms)"
    # E2E: 600 ms -> 620 ms at p50
    assert rows["e2e_ms.p50"].rel_error == pytest.approx(20 / 600, rel=1e-5)
    # makespan 2.9 s -> 2.93 s; 9 output tokens each, so throughput moves the other way
    assert rows["duration_s"].rel_error == pytest.approx(0.03 / 2.9, rel=1e-5)
    # rates are rounded to 6 significant digits before the error is taken
    assert rows["output_throughput"].rel_error == pytest.approx(2.9 / 2.93 - 1, rel=1e-3)
    preemptions = rows["num_preemptions"]
    assert (preemptions.real, preemptions.sim, preemptions.diff, preemptions.rel_error) == (0, 2, 2, None)
    hit_rate = rows["prefix_cache_hit_rate"]
    assert hit_rate.real == pytest.approx(50 / 300, rel=1e-5)
    assert hit_rate.sim == pytest.approx(100 / 300, rel=1e-5)
    assert hit_rate.rel_error == pytest.approx(1.0, rel=1e-5)
    steps = rows["num_steps"]
    assert (steps.real, steps.sim, steps.diff) == (3, 4, 1)
    assert steps.rel_error == pytest.approx(1 / 3, rel=1e-5)
    assert rows["mean_step_duration_ms"].real == pytest.approx(200.0)
    assert rows["mean_step_duration_ms"].rel_error == pytest.approx(0.0, abs=1e-9)
    assert rows["num_rejected"].rel_error is None


def test_identical_runs_have_zero_errors() -> None:
    rows = rows_by_key(real_requests(), real_requests(), real_steps(), real_steps())
    for row in rows.values():
        assert row.rel_error in (0.0, None), row
        assert row.diff in (0, 0.0), row


def test_text_and_markdown_tables() -> None:
    rows = error_table(run_metrics(real_requests(), real_steps())[1], run_metrics(sim_requests(), sim_steps())[1])
    text = format_error_table(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "real", "sim", "diff", "rel.", "error"]
    assert len(lines) == len(METRIC_SPECS) + 1
    ttft = next(line for line in lines if line.startswith("TTFT p50 (ms)"))
    assert ttft.split()[-5:] == ["200.0", "220.0", "+20.00", "+10.00", "%"]
    preemptions = next(line for line in lines if line.startswith("preemptions"))
    assert preemptions.split()[-4:] == ["0", "2", "+2", "n/a"]
    assert len({len(line) for line in lines[1:]}) <= 2  # right-aligned numbers: rows end in the same column
    markdown = error_table_markdown(rows, "real-run", "sim-run").splitlines()
    assert markdown[0] == "| metric | real (real-run) | sim (sim-run) | diff (sim - real) | rel. error |"
    assert markdown[1] == "|:---|---:|---:|---:|---:|"
    assert "| TTFT p50 (ms) | 200.0 | 220.0 | +20.00 | +10.00 % |" in markdown
    assert "| preemptions | 0 | 2 | +2 | n/a |" in markdown
    assert "| prefix-cache hit rate | 16.67 % | 33.33 % | +16.67 pp | +100.00 % |" in markdown


def test_format_float_uses_fixed_notation() -> None:
    assert format_float(13694.2) == "13694"
    assert format_float(5.36) == "5.360"
    assert format_float(0.26161) == "0.2616"
    assert format_float(-0.5545, sign=True) == "-0.5545"
    assert format_float(0.0) == "0"
    assert format_float(1.5e-9) == "1.5e-09"


def test_request_join_pairs_requests_and_reports_match_shares() -> None:
    real = real_requests()
    sim = sim_requests().filter(pl.col("request_id") != "r0")
    extra = requests_frame([dict(request_id="x9", arrival_s=5.0)])
    sim = pl.concat([sim, extra])
    join = join_requests(real, sim)
    assert join.frame["request_id"].to_list() == ["r1", "r2"]
    assert (join.num_real, join.num_sim, join.num_matched) == (3, 3, 2)
    assert join.matched_share_real == pytest.approx(2 / 3, rel=1e-5)
    assert join.matched_share_sim == pytest.approx(2 / 3, rel=1e-5)
    assert join.frame["ttft_s_real"].to_list() == pytest.approx([0.2, 0.3])
    assert join.frame["ttft_s_sim"].to_list() == pytest.approx([0.22, 0.33])
    assert join.frame["ttft_rel_error"].to_list() == pytest.approx([0.1, 0.1])
    assert join.frame["tpot_rel_error"].to_list() == pytest.approx([0.0, 0.0], abs=1e-9)
    stats = join.error_stats()
    assert stats["ttft"]["num_pairs"] == 2
    assert stats["ttft"]["p50"] == pytest.approx(0.1)
    assert stats["ttft"]["mean_abs"] == pytest.approx(0.1)
    assert join.to_dict()["num_matched"] == 2


def test_request_join_casts_ids_to_utf8() -> None:
    real = real_requests().with_columns(pl.Series("request_id", [1, 2, 3]))
    sim = sim_requests().with_columns(pl.Series("request_id", ["1", "2", "3"]))
    assert join_requests(real, sim).num_matched == 3


def test_no_common_requests_names_both_runs() -> None:
    sim = sim_requests().with_columns(("other-" + pl.col("request_id")).alias("request_id"))
    with pytest.raises(NoCommonRequestsError) as excinfo:
        join_requests(real_requests(), sim, real_name="/runs/gpu-a", sim_name="/runs/sim-b")
    message = str(excinfo.value)
    assert "/runs/gpu-a" in message and "/runs/sim-b" in message
    assert "no request ids in common" in message


def test_repeated_request_ids_are_rejected() -> None:
    real = pl.concat([real_requests(), real_requests().head(1)])
    with pytest.raises(CompareInputError, match="r0"):
        join_requests(real, sim_requests(), real_name="real-dir")


def test_compare_runs_from_folders(tmp_path: Path) -> None:
    real_dir, sim_dir = write_pair(tmp_path)
    comparison = compare_runs(load_run(real_dir, "real"), load_run(sim_dir, "sim"))
    assert comparison.sim.cost_model == "roofline-estimate"
    assert comparison.real.cost_model is None
    assert comparison.config_differences == {"max_num_seqs": {"real": 256, "sim": 8}}
    rows = {row.key: row for row in comparison.rows}
    assert rows["ttft_ms.p50"].rel_error == pytest.approx(0.10)
    document = comparison.to_dict()
    json.dumps(document)  # JSON-ready
    assert document["sim"]["dir"] == str(sim_dir)
    assert document["requests"]["num_matched"] == 3
    assert document["schedule"]["identical"] is False
    assert comparison.real_summary["mean_step_duration_ms"] == pytest.approx(200.0)
    markdown = markdown_document(comparison)
    assert markdown.startswith("Simulation `sim` (cost model: `roofline-estimate`) vs real `real`")


def test_config_differences_ignore_volatile_keys() -> None:
    assert config_differences({"a": 1, "simulator_wall_s": 1.0}, {"a": 1, "simulator_wall_s": 2.0}) == {}
    assert config_differences({"a": 1}, {"b": 2}) == {"a": {"real": 1, "sim": None}, "b": {"real": None, "sim": 2}}
