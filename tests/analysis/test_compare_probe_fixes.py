"""Hostile-input probe fixes for analysis.compare, analysis.summarize and analysis.vllm_import: runs given in the
wrong order, unrelated requests paired on a shared id, NaN/Infinity written back as JSON, a --limit the result
file contradicts, and misleading one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from analysis.compare.cli import main as compare_main
from analysis.summarize import main as summarize_main
from analysis.vllm_import import main as import_main
from cli.sim_replay import main as sim_main
from tests.analysis.frames import requests_frame
from tests.analysis.test_compare import real_requests, real_steps, sim_requests, sim_steps, write_run
from tests.analysis.test_vllm_import import PROMPTS, vllm_result
from traces.schema import save_trace

SIM_COST_MODEL = "profile:h200/qwen3-0.6b (measured 2026-12-02)"  # a profile's name says "measured" too


def run(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) -> (exit code, stdout, stderr); argparse's SystemExit counts as a return."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sim_run(path: Path) -> Path:
    return write_run(path, sim_requests(), sim_steps(), {"cost_model": SIM_COST_MODEL, "config": {"max_num_seqs": 8}})


def gpu_run(path: Path) -> Path:
    """A run engine.replay measured on a GPU: its cost model is "measured"."""
    return write_run(path, real_requests(), real_steps(), {"cost_model": "measured", "config": {"max_num_seqs": 8}})


# 1. A simulated REAL_DIR beside a measured SIM_DIR.

def test_a_simulated_real_dir_beside_a_measured_sim_dir_is_refused(tmp_path, capsys) -> None:
    sim, gpu = sim_run(tmp_path / "sim"), gpu_run(tmp_path / "gpu")
    code, out, err = run(compare_main, [str(sim), str(gpu), "--out", str(tmp_path / "out"), "--no-report"], capsys)
    assert (code, out) == (2, "")
    assert err == (f"error: {sim} is a simulated run (cost model {SIM_COST_MODEL!r}) and {gpu} a measured one "
                   f"('measured'); the order is REAL_DIR then SIM_DIR: python -m analysis.compare {gpu} {sim}\n")
    assert not (tmp_path / "out").exists()
    # The right order, two simulations and two measured runs compare.
    for real, other in ((gpu, sim), (sim, sim_run(tmp_path / "sim2")), (gpu, gpu_run(tmp_path / "gpu2"))):
        out_dir = tmp_path / f"out-{real.name}-{other.name}"
        assert run(compare_main, [str(real), str(other), "--out", str(out_dir), "--no-report"], capsys)[0] == 0


def test_a_vllm_result_given_as_sim_dir_is_refused(tmp_path, capsys) -> None:
    result = tmp_path / "vllm.json"
    result.write_text(json.dumps(vllm_result()))
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["r0", "r1", "r2", "r3"], "arrival_s": [0.0, 0.5, 1.0, 1.2],
                             "prompt_tokens": PROMPTS, "output_tokens": [3, 4, 1, 2]}), trace)
    sim = tmp_path / "sim"
    assert sim_main([str(trace), "--out", str(sim), "--quiet", "--no-report"]) == 0
    code, _, err = run(compare_main, [str(sim), str(result), "--out", str(tmp_path / "out"), "--no-report"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"and {result} a measured one ('vllm bench serve (client-side timing)'); the order is REAL_DIR then " \
           f"SIM_DIR: python -m analysis.compare {result} {sim}\n" in err
    assert run(compare_main, [str(result), str(sim), "--out", str(tmp_path / "ok"), "--no-report"], capsys)[0] == 0


# 2. --allow-different-requests pairs only the same requests.

def test_ids_with_other_prompt_lengths_are_not_paired(tmp_path, capsys) -> None:
    real = gpu_run(tmp_path / "real")
    other = real_requests().with_columns(pl.Series("prompt_tokens", [100, 7, 9]))  # r1, r2: other requests
    other = other.with_columns(pl.min_horizontal("cached_tokens", "prompt_tokens").alias("cached_tokens"))
    sim = write_run(tmp_path / "sim", other, sim_steps(), {"cost_model": "roofline-estimate"})
    out_dir = tmp_path / "out"
    code, out, _ = run(compare_main, [str(real), str(sim), "--out", str(out_dir), "--no-report",
                                      "--allow-different-requests"], capsys)
    assert code == 0
    assert ("requests matched on request_id: 1 of 3 real (33.3 %), 1 of 3 sim (33.3 %); 2 request ids on both "
            "sides left out: other prompt lengths, so other requests\n") in out
    requests = json.loads((out_dir / "compare.json").read_text())["requests"]
    assert (requests["num_matched"], requests["num_left_out_other_prompt_lengths"]) == (1, 2)
    assert requests["relative_errors"]["ttft"]["num_pairs"] == 1
    assert pl.read_parquet(out_dir / "compare.parquet")["request_id"].to_list() == ["r0"]


def test_runs_of_two_traces_share_no_request(tmp_path, capsys) -> None:
    """Both traces number their requests alike: every pair was another request's (+507 % E2E)."""
    real = gpu_run(tmp_path / "real")
    rows = [{**row, "prompt_tokens": 7, "cached_tokens": min(row["cached_tokens"], 7)}
            for row in sim_requests().iter_rows(named=True)]
    sim = write_run(tmp_path / "sim", requests_frame(rows), sim_steps(), {"cost_model": "roofline-estimate"})
    out_dir = tmp_path / "out"
    code, out, _ = run(compare_main, [str(real), str(sim), "--out", str(out_dir), "--allow-different-requests"],
                       capsys)
    assert code == 0
    assert ("requests matched on request_id: 0 of 3 real (0.0 %), 0 of 3 sim (0.0 %); 3 request ids on both sides "
            "left out: other prompt lengths, so other requests\n") in out
    assert json.loads((out_dir / "compare.json").read_text())["requests"]["num_left_out_other_prompt_lengths"] == 3
    assert (out_dir / "report.html").is_file()


# 3. NaN and Infinity are no JSON: refused by file and key, never written back.

def _nan_config_run(tmp_path: Path) -> Path:
    run_dir = gpu_run(tmp_path / "nan")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config"] |= {"qps": float("nan"), "max_num_seqs": float("inf")}
    (run_dir / "summary.json").write_text(json.dumps(summary))  # Python's json writes NaN and Infinity
    return run_dir


def test_summarize_refuses_nan_in_config(tmp_path, capsys) -> None:
    run_dir = _nan_config_run(tmp_path)
    before = (run_dir / "summary.json").read_text()
    code, _, err = run(summarize_main, [str(run_dir), "--quiet"], capsys)
    assert (code, err) == (2, f"error: {run_dir / 'summary.json'}: 'config.max_num_seqs' is NaN or Infinity; "
                              "expected a finite number, a string or null\n")
    assert (run_dir / "summary.json").read_text() == before


def test_compare_refuses_nan_in_config(tmp_path, capsys) -> None:
    run_dir, sim = _nan_config_run(tmp_path), sim_run(tmp_path / "sim")
    code, _, err = run(compare_main, [str(run_dir), str(sim), "--out", str(tmp_path / "out"), "--no-report"], capsys)
    assert (code, err) == (2, f"error: {run_dir / 'summary.json'}: 'config.max_num_seqs' is NaN or Infinity; "
                              "expected a finite number, a string or null\n")
    assert not (tmp_path / "out").exists()


def test_vllm_import_refuses_nan_in_the_result(tmp_path, capsys) -> None:
    result = tmp_path / "vllm.json"
    result.write_text(json.dumps(vllm_result() | {"burstiness": float("nan")}))
    code, _, err = run(import_main, [str(result), "--out", str(tmp_path / "out"), "--quiet"], capsys)
    assert (code, err) == (2, f"error: {result}: 'burstiness' is NaN or Infinity; expected a finite number, a string "
                              "or null\n")
    assert not (tmp_path / "out").exists()


def test_summary_json_and_compare_json_are_strict_json(tmp_path, capsys) -> None:
    """The writers refuse NaN themselves (allow_nan=False): whatever gets past the readers is never written."""
    from analysis.runs import write_summary

    with pytest.raises(ValueError, match="Out of range float"):
        write_summary(tmp_path, real_requests(), real_steps(), {"config": {"qps": float("nan")}})
    assert not (tmp_path / "summary.json").exists()
    out_dir = tmp_path / "out"
    assert run(compare_main, [str(gpu_run(tmp_path / "gpu")), str(sim_run(tmp_path / "sim")), "--out", str(out_dir),
                              "--no-report"], capsys)[0] == 0
    json.loads((out_dir / "compare.json").read_text(), parse_constant=lambda name: pytest.fail(name))


# 4. --limit must be the number of requests the file records.

@pytest.mark.parametrize("limit", [8, 2])
def test_a_limit_the_result_contradicts_is_refused(tmp_path, capsys, limit) -> None:
    result = tmp_path / "vllm.json"
    result.write_text(json.dumps(vllm_result()))
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": [f"r{i}" for i in range(10)], "arrival_s": [0.1 * i for i in range(10)],
                             "prompt_tokens": PROMPTS + [20] * 6, "output_tokens": [3] * 10}), trace)
    argv = [str(result), "--trace", str(trace), "--out", str(tmp_path / "out"), "--quiet", "--no-report"]
    code, _, err = run(import_main, [*argv, "--limit", str(limit)], capsys)
    assert (code, err) == (2, f"error: --limit {limit}, but {result} records 4 requests; expected --limit 4 (the "
                              "trace's first N rows were replayed) or no --limit\n")
    assert not (tmp_path / "out").exists()
    assert run(import_main, [*argv, "--limit", "4"], capsys)[0] == 0
    assert pl.read_parquet(tmp_path / "out" / "requests.parquet")["request_id"].to_list() == ["r0", "r1", "r2", "r3"]


# 5. Messages that named the wrong cause.

def test_a_runs_summary_json_says_to_pass_its_folder(tmp_path, capsys) -> None:
    run_dir, sim = gpu_run(tmp_path / "gpu"), sim_run(tmp_path / "sim")
    summary = run_dir / "summary.json"
    expected = (f"error: {summary}: a run's summary.json, not a vllm bench serve result; pass the folder holding it "
                f"({run_dir}), a run folder already, to analysis.compare or analysis.summarize\n")
    code, _, err = run(compare_main, [str(summary), str(sim), "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, expected)
    code, _, err = run(import_main, [str(summary), "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, expected)


def test_a_steps_parquet_that_is_a_directory_says_so(tmp_path, capsys) -> None:
    run_dir, sim = gpu_run(tmp_path / "gpu"), sim_run(tmp_path / "sim")
    (run_dir / "steps.parquet").unlink()
    (run_dir / "steps.parquet").mkdir()
    code, _, err = run(compare_main, [str(run_dir), str(sim), "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, f"error: {run_dir / 'steps.parquet'}: is a directory; expected a parquet file\n")
    shutil.rmtree(run_dir / "steps.parquet")
    code, _, err = run(compare_main, [str(run_dir), str(sim), "--out", str(tmp_path / "out")], capsys)
    assert (code, err) == (2, f"error: {run_dir / 'steps.parquet'}: no such file\n")
