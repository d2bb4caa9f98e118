"""Results that could not be trusted and said nothing: a capacity answer decided by the rejections its streams
happened to draw, and a vLLM result whose headline count is not its lists'."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.vllm_import import VllmResultError, read_vllm_result
from traces.schema import save_trace


def test_a_trace_with_prompts_that_never_fit_says_the_answer_may_be_decided_by_rejections(tmp_path, capsys) -> None:
    """5 of 100 prompts beyond max_model_len, --slo ttft_p90: a QPS whose window drew a few more of them failed with
    the replica idle (TTFT 2 ms), and the QPS below it was printed as the capacity without a word."""
    trace = tmp_path / "trace.parquet"
    n = 100
    save_trace(pl.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": [float(i) for i in range(n)],
                             "prompt_tokens": [100] * 95 + [100_000] * 5, "output_tokens": [10] * n}), trace)
    out = tmp_path / "out"
    assert capacity_main([str(trace), "--slo", "ttft_p90=2s", "--out", str(out), "--min-duration-s", "5",
                          "--min-requests", "10", "--max-iterations", "2", "--no-duration-check", "--jobs", "1"]) == 0
    expected = ("5 of 100 requests of the trace (5.0%) can never fit (the shortest of them: prompt has 100000 tokens, "
                "more than max_model_len=40960); each stream rejects its own draw of them and a rejected request "
                "counts as infinitely slow, so a QPS can fail by the rejections its window drew rather than by load "
                "(see num_rejected of the points)")
    [result] = json.loads((out / "capacity.json").read_text())
    assert result["notes"][0] == expected
    assert expected in capsys.readouterr().out


def _vllm_file(path: Path, **changes) -> Path:
    data = {"duration": 2.0, "completed": 2, "input_lens": [10, 10], "output_lens": [3, 3], "ttfts": [0.1, 0.1],
            "itls": [[0.1, 0.1], [0.1, 0.1]], "errors": ["", ""]} | changes
    path.write_text(json.dumps(data))
    return path


def test_a_vllm_result_whose_completed_count_is_not_its_lists_is_refused(tmp_path) -> None:
    """completed 500 beside lists of 2 requests (lists cut or pasted from another run) was imported as 2 requests."""
    path = _vllm_file(tmp_path / "r.json", completed=500)
    with pytest.raises(VllmResultError) as caught:
        read_vllm_result(path)
    assert str(caught.value) == (f"{path}: 'completed' is 500, but 2 of the 2 requests its lists record succeeded; "
                                 "expected the per-request lists of the same run")
    # A failure counted as vLLM counts it, and a file without the count, are read.
    assert read_vllm_result(_vllm_file(tmp_path / "ok.json", completed=1, errors=["", "boom"], ttfts=[0.1, 0.0],
                                       itls=[[0.1, 0.1], []])).requests.height == 2
    assert read_vllm_result(_vllm_file(tmp_path / "none.json", completed=None)).requests.height == 2


def test_a_client_timed_run_where_every_request_failed_has_no_step_log(tmp_path, capsys) -> None:
    """A vllm bench serve result (or a traces.bench run) of failures only: no request got a token, so its tables
    looked like an engine's log of 0 steps: "engine steps 0" and a schedule diff of 0 real steps against the
    simulation's, failing --require-identical-schedule as "schedules differ" (exit 1)."""
    from analysis.compare.cli import main as compare_main
    from cli.sim_replay import main as replay_main

    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["0", "1"], "arrival_s": [0.0, 1.0], "prompt_tokens": [10, 10],
                             "output_tokens": [3, 3]}), trace)
    assert replay_main([str(trace), "--quiet", "--no-report", "--out", str(tmp_path / "sim")]) == 0
    real = _vllm_file(tmp_path / "failed.json", completed=0, errors=["boom", "bang"], ttfts=[0.0, 0.0],
                      output_lens=[0, 0], itls=[[], []])
    capsys.readouterr()
    assert compare_main([str(real), str(tmp_path / "sim"), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert [line.split()[2] for line in out.splitlines() if line.startswith("engine steps")] == ["n/a"]
    assert f"schedule diff: n/a (real ({real}) logged no engine steps" in out
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["real"]["summary"]["num_steps"] is None


def test_a_request_too_long_to_simulate_is_refused_before_the_sweep(tmp_path, capsys, monkeypatch) -> None:
    """With the limits lifted for a what-if, a row of 10 billion output tokens was a RequestMemoryError traceback from
    a worker's simulation mid-sweep (and, before the simulator refused it, a sweep that ran on): one line first."""
    import analysis.capacity.plan

    monkeypatch.setattr(analysis.capacity.plan, "host_memory_available", lambda: 8 * 2**30)
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": [f"r{i}" for i in range(20)], "arrival_s": [float(i) for i in range(20)],
                             "prompt_tokens": [100] * 20, "output_tokens": [10] * 3 + [10_000_000_000] + [10] * 16}),
               trace)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        capacity_main([str(trace), "--slo", "ttft_p90=2s", "--out", str(out), "--allow-long-max-model-len",
                       "--max-model-len", "20000000000", "--num-gpu-blocks", "2000000000", "--jobs", "1"])
    assert exc.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: ") and line.endswith(
        f"{trace}: row 3 (request_id 'r3'): its 10,000,000,100 tokens (prompt and output, as the limits cut them) need "
        "111.8 GiB to simulate, more than this host's 8.0 GiB available; expected requests the limits cut shorter (a "
        "smaller --max-model-len or --num-gpu-blocks) or a trace without them (--limit)")
    assert not out.exists()
