"""``vllm bench serve --save-result --save-detailed`` result files: read as runs, converted to run folders,
compared with a simulation directly; what the file does not record is n/a, a malformed file one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analysis.compare.cli import main as compare_main
from analysis.vllm_import import main as import_main
from analysis.vllm_import import read_vllm_result
from cli.sim_replay import main as sim_main
from traces.schema import save_trace

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [5, 8, 11, 14]

# Four requests as vLLM's benchmark records them; the third failed (HTTP 400: vLLM stores the reason phrase).
START_TIMES = [100.0, 100.5, 101.0, 101.2]
TTFTS = [0.05, 0.06, 0.0, 0.04]
ITLS = [[0.01, 0.02], [0.01, 0.01, 0.01], [], [0.03]]
OUTPUT_LENS = [3, 4, 0, 2]
ERRORS = ["", "", "Bad Request", ""]
DURATION_S = 1.5


def vllm_metrics() -> dict:
    """The flat metrics exactly as vllm/benchmarks/serve.py's calculate_metrics computes them (numpy, seconds
    to ms), over the successful requests."""
    ok = [i for i, error in enumerate(ERRORS) if not error]
    latencies = [TTFTS[i] + sum(ITLS[i]) for i in range(4)]
    ttfts = [TTFTS[i] for i in ok]
    tpots = [(latencies[i] - TTFTS[i]) / (OUTPUT_LENS[i] - 1) for i in ok if OUTPUT_LENS[i] > 1]
    itls = [gap for i in ok for gap in ITLS[i]]
    e2els = [latencies[i] for i in ok]
    total_input = sum(PROMPTS[i] for i in ok)
    total_output = sum(OUTPUT_LENS)
    metrics = {"duration": DURATION_S, "completed": len(ok), "failed": 4 - len(ok), "total_input_tokens": total_input,
               "request_throughput": len(ok) / DURATION_S, "output_throughput": total_output / DURATION_S,
               "total_token_throughput": (total_input + total_output) / DURATION_S}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        metrics |= {f"mean_{name}_ms": np.mean(values) * 1000, f"median_{name}_ms": np.median(values) * 1000,
                    f"std_{name}_ms": np.std(values) * 1000, f"p99_{name}_ms": np.percentile(values, 99) * 1000}
    return metrics


def vllm_result(detailed_keys: tuple[str, ...] = ("start_times", "latencies", "errors")) -> dict:
    """A result file in vLLM's layout; older versions lack start_times and latencies (and very old ones errors)."""
    result = {"date": "20261201-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
              "model_id": "Qwen/Qwen3-0.6B", "tokenizer_id": "Qwen/Qwen3-0.6B", "num_prompts": 4,
              "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None, "total_output_tokens": 9,
              "request_goodput": None, "input_lens": PROMPTS, "output_lens": OUTPUT_LENS, "ttfts": TTFTS,
              "itls": ITLS, "generated_texts": ["a b c", "d e f g", "", "h i"], **vllm_metrics()}
    optional = {"start_times": START_TIMES, "errors": ERRORS,
                "latencies": [TTFTS[i] + sum(ITLS[i]) if not ERRORS[i] else 0.0 for i in range(4)]}
    result |= {key: optional[key] for key in detailed_keys}
    return result


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def result_path(tmp_path) -> Path:
    return _write(tmp_path / "vllm-2.0qps-Qwen3-0.6B.json", vllm_result())


@pytest.fixture
def sim_dir(tmp_path) -> Path:
    """A simulation of the trace the benchmark replayed: same requests, same order, same prompt lengths."""
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["r0", "r1", "r2", "r3"], "arrival_s": [0.0, 0.5, 1.0, 1.2],
                             "prompt_tokens": PROMPTS, "output_tokens": [3, 4, 1, 2]}), trace)
    out = tmp_path / "sim"
    assert sim_main([str(trace), "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def test_requests_as_the_file_records_them(result_path) -> None:
    run = read_vllm_result(result_path)
    frame = run.requests
    assert frame["request_id"].to_list() == ["0", "1", "2", "3"]
    assert frame["arrival_s"].to_list() == pytest.approx([0.0, 0.5, 1.0, 1.2])
    assert frame["finish_reason"].to_list() == ["length", "length", "error", "length"]
    assert frame["error"].to_list() == [None, None, "Bad Request", None]
    assert frame["token_times_s"][0].to_list() == pytest.approx([0.05, 0.06, 0.08])
    assert frame["finish_s"].to_list() == pytest.approx([0.08, 0.59, 1.0, 1.27])
    # Never recorded: null, not 0.
    for column in ("first_scheduled_s", "cached_tokens", "num_preemptions"):
        assert frame[column].null_count() == 4, column
    assert run.steps.height == 0 and run.meta["recorded_duration_s"] == DURATION_S
    assert run.meta["config"]["arrival_times_recorded"] is True


def test_a_request_without_a_first_token_nor_an_error_is_a_failure_that_says_so(tmp_path) -> None:
    """A null ttft beside an empty error was counted as failed with a null error: the one failure without a why."""
    # "completed" as the edited lists make it: a count of another run's is refused (test below)
    run = read_vllm_result(_write(tmp_path / "r.json", vllm_result() | {"ttfts": [0.05, None, 0.0, 0.04],
                                                                       "completed": 2}))
    assert run.requests["finish_reason"].to_list() == ["length", "error", "error", "length"]
    assert run.requests["error"].to_list() == [None, "failed (the file records no first token and no error message)",
                                               "Bad Request", None]


@pytest.mark.parametrize("detailed_keys", [("start_times", "latencies", "errors"), ("errors",), ()],
                         ids=["current", "no start_times or latencies", "no errors either"])
def test_converted_summary_reproduces_vllms_numbers(tmp_path, detailed_keys) -> None:
    """Our summary of the imported run carries vLLM's flat names with vLLM's own values, in every version."""
    path = _write(tmp_path / "result.json", vllm_result(detailed_keys))
    out = tmp_path / "run"
    assert import_main([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    expected = vllm_metrics()
    assert {key: summary[key] for key in expected} == pytest.approx(expected, rel=1e-5)
    assert summary["num_failed"] == 1
    assert summary["prefix_cache_hit_rate"] is None and summary["num_preemptions"] is None
    assert summary["num_steps"] is None and summary["queue_ms"]["p50"] is None
    if "start_times" not in detailed_keys:  # arrivals unknown: every request at t = 0, latencies unchanged
        requests = pl.read_parquet(out / "requests.parquet")
        assert requests["arrival_s"].unique().to_list() == [0.0]


def test_compare_reads_the_result_file_directly(tmp_path, result_path, sim_dir, capsys) -> None:
    out = tmp_path / "cmp"
    assert compare_main([str(result_path), str(sim_dir), "--out", str(out), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "requests matched on request_id: 4 of 4 real" in printed
    assert "schedule diff: n/a (real (" in printed and "logged no engine steps" in printed
    rows = {row.split("  ")[0]: row.split() for row in printed.splitlines()}
    assert rows["preemptions"][-4:] == ["n/a", "0", "n/a", "n/a"]
    assert rows["prefix-cache hit rate"][-5:] == ["n/a", "0.00", "%", "n/a", "n/a"]
    assert rows["engine steps"][-4:-1] == ["n/a", rows["engine steps"][-3], "n/a"]
    compared = json.loads((out / "compare.json").read_text())
    metrics = {m["key"]: m for m in compared["metrics"]}
    assert metrics["num_preemptions"]["real"] is None and metrics["num_preemptions"]["rel_error"] is None
    assert metrics["request_throughput"]["real"] == pytest.approx(3 / DURATION_S)
    assert compared["schedule"]["identical"] is None and compared["schedule"]["unavailable"]
    # The positions took the simulation's request ids, in its arrival order.
    pairs = pl.read_parquet(out / "compare.parquet")
    assert pairs["request_id"].to_list() == ["r0", "r1", "r2", "r3"]
    assert pairs["ttft_s_real"].to_list()[:2] == pytest.approx([0.05, 0.06])


def test_converted_folder_compares_too(tmp_path, result_path, sim_dir) -> None:
    trace = sim_dir.parent / "trace.parquet"
    run_dir = tmp_path / "vllm-run"
    assert import_main([str(result_path), "--out", str(run_dir), "--trace", str(trace), "--quiet"]) == 0
    assert pl.read_parquet(run_dir / "requests.parquet")["request_id"].to_list() == ["r0", "r1", "r2", "r3"]
    assert (run_dir / "report.html").is_file()
    assert compare_main([str(run_dir), str(sim_dir), "--out", str(tmp_path / "cmp"), "--no-report"]) == 0
    # The schedule cannot be held to identity without a step log: a usage error, not a verdict.
    proc = subprocess.run([sys.executable, "-m", "analysis.compare", str(run_dir), str(sim_dir), "--out",
                           str(tmp_path / "cmp2"), "--require-identical-schedule"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "schedule diff: n/a" in proc.stderr.strip().splitlines()[-1]


def _bad_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = vllm_result()
    cases = {
        "not json": ("{not json", "not a readable JSON file"),
        "nested deep": ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read"),  # RecursionError
        # json.loads' plain ValueError: Python's message alone ('Exceeds the limit (4300 digits)'), no file named
        "integer of 5000 digits": ('{"duration": ' + "9" * 5000 + "}",
                                   "not a readable JSON file (a number of more than 4300 digits)"),
        "a list": ([1, 2], "expected a JSON object"),
        "summary only": ({k: v for k, v in good.items() if k not in ("ttfts", "itls", "input_lens", "output_lens")},
                         "rerun vllm bench serve with --save-detailed"),
        "lists of other lengths": (good | {"ttfts": TTFTS[:3]}, "'ttfts' has 3 items, 'input_lens' 4"),
        "negative ttft": (good | {"ttfts": [0.05, -1.0, 0.0, 0.04]}, "'ttfts' item 1: expected a finite number"),
        # A traceback in analysis.compare, and a message naming no file in analysis.vllm_import.
        "huge ttft": (good | {"ttfts": [1e308, 0.05, 0.0, 0.04]}, "'ttfts' item 0: expected a finite number from 0 "
                                                                   "to 2e+12, got 1e+308"),
        "gaps past the bound": (good | {"itls": [[1.5e12, 1.5e12], [], [], []], "latencies": None},
                                "the requests it records are impossible"),
        "text input length": (good | {"input_lens": [5, "8", 11, 14]}, "'input_lens' item 1: expected an integer"),
        "itls not lists": (good | {"itls": [0.1, 0.1, 0.1, 0.1]}, "'itls' item 0: expected a list"),
        "no duration": ({k: v for k, v in good.items() if k != "duration"}, "no 'duration'"),
        # throughputs of '-' (0) or too high (0.1 s) beside latencies the duration cannot hold, without a word
        "zero duration": (good | {"duration": 0}, "'duration' is 0 s, but its requests span "),
        "short duration": (good | {"duration": 0.1}, "'duration' is 0.1 s, but its requests span "),
        "empty": (good | {k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "start_times",
                                          "latencies")}, "'input_lens' is empty"),
        # Both were imported (and compared) as if measured: a last token after the request's end, and more streamed
        # chunks than the tokens they carried.
        "last token after the finish": (good | {"latencies": [0.07, 0.09, 0.0, 0.07]},
                                        "'latencies' item 0 is 0.07 s, but 'ttfts' and 'itls' item 0 put its last "
                                        "chunk at 0.08 s; expected a latency"),
        "more chunks than tokens": (good | {"output_lens": [3, 2, 0, 2]},
                                    "'itls' item 1 has 3 gaps (4 streamed chunks), 'output_lens' item 1 2; expected "
                                    "at most one chunk per output token"),
    }
    out = {}
    for name, (content, message) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        out[name] = (path, message)
    return out


@pytest.mark.parametrize("tool", ["analysis.compare", "analysis.vllm_import"])
def test_malformed_file_is_one_line_exit_2(tmp_path, sim_dir, tool) -> None:
    for name, (path, message) in _bad_files(tmp_path).items():
        args = [str(path), str(sim_dir)] if tool == "analysis.compare" else [str(path)]
        proc = subprocess.run([sys.executable, "-m", tool, *args, "--out", str(tmp_path / "out")], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and len(lines) == 1, (name, proc.stderr)
        assert lines[0].startswith(f"error: {path}: ") and message in lines[0], (name, lines[0])
        assert not (tmp_path / "out").exists()


def test_latencies_a_clock_read_short_of_the_chunks_are_kept(tmp_path) -> None:
    """vLLM reads the clock again for the first chunk's TTFT, so TTFT plus the gaps can pass the latency by a hair
    (and float sums round): such a request is read with its finish at its last chunk, not refused."""
    latencies = [TTFTS[i] + sum(ITLS[i]) - 2e-7 if not ERRORS[i] else 0.0 for i in range(4)]
    run = read_vllm_result(_write(tmp_path / "r.json", vllm_result() | {"latencies": latencies}))
    last = [times[-1] if len(times) else None for times in run.requests["token_times_s"].to_list()]
    assert run.requests["finish_s"].to_list()[:2] == last[:2]


def test_a_chat_results_role_chunk_is_no_token(tmp_path) -> None:
    """vLLM's openai-chat backend times the role chunk as the first token: one chunk more than the output tokens
    is the TTFT but no token time; two more is refused."""
    chat = vllm_result() | {"backend": "openai-chat", "endpoint_type": "openai-chat", "output_lens": [2, 3, 0, 1]}
    run = read_vllm_result(_write(tmp_path / "chat.json", chat))
    assert run.requests["first_token_s"].to_list()[0] == pytest.approx(0.05)
    assert run.requests["token_times_s"][0].to_list() == pytest.approx([0.06, 0.08])
    assert run.requests["output_tokens"].to_list() == [2, 3, 0, 1]
    with pytest.raises(ValueError, match="'itls' item 1 has 3 gaps \\(4 streamed chunks\\), 'output_lens' item 1 2; "
                       "expected at most one chunk per output token and the chat role chunk"):
        read_vllm_result(_write(tmp_path / "chat2.json", chat | {"output_lens": [2, 2, 0, 1]}))


def test_a_chat_result_says_its_itl_is_not_the_files(tmp_path) -> None:
    """vLLM pools the gap from the role chunk to the first token into its ITL; the import drops the role chunk's time,
    so the summary's mean_itl_ms (vLLM's name) differed from the file's own without a word. The config counts the
    requests concerned; TTFT, TPOT and E2E stay vLLM's."""
    chat = vllm_result() | {"backend": "openai-chat", "endpoint_type": "openai-chat", "output_lens": [2, 3, 0, 2]}
    out = tmp_path / "run"
    assert import_main([str(_write(tmp_path / "chat.json", chat)), "--out", str(out), "--quiet", "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["chat_role_chunks"] == 2  # requests 0 and 1; request 3's two chunks are two tokens
    assert summary["mean_itl_ms"] == pytest.approx(np.mean([0.02, 0.01, 0.01, 0.03]) * 1000)  # the role gaps left out
    assert summary["mean_ttft_ms"] == pytest.approx(vllm_metrics()["mean_ttft_ms"])
    assert summary["mean_e2el_ms"] == pytest.approx(vllm_metrics()["mean_e2el_ms"])
    plain = read_vllm_result(_write(tmp_path / "plain.json", vllm_result()))
    assert "chat_role_chunks" not in plain.meta["config"]


def test_an_offline_replay_names_the_files_requests_in_the_traces_order(tmp_path) -> None:
    """`vllm bench serve --request-rate inf` sends the trace's rows in order; the simulation of the same trace has
    every request at t = 0, its table ordered by id as text ("0", "1", "10", "11", "2", ...). Request 2 of the file
    took id "10", and with prompts of one length nothing refused the pairs: every per-request error was another
    request's."""
    from analysis.compare.comparison import name_positional_requests
    from analysis.compare.inputs import load_run

    n = 12
    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": list(range(n)), "arrival_s": [0.0] * n, "prompt_tokens": [64] * n,
                             "output_tokens": [4] * n}), trace)
    assert sim_main([str(trace), "--out", str(tmp_path / "sim"), "--quiet", "--no-report"]) == 0
    result = vllm_result() | {"input_lens": [64] * n, "output_lens": [4] * n, "ttfts": [0.05] * n,
                              "itls": [[0.01] * 3] * n, "errors": [""] * n, "latencies": [0.08] * n,
                              "start_times": [100.0 + 1e-4 * i for i in range(n)], "num_prompts": n,
                              "completed": n}
    real = load_run(_write(tmp_path / "inf.json", result), "real")
    real, _ = name_positional_requests(real, load_run(tmp_path / "sim", "sim"))
    assert real.requests.sort("arrival_s")["request_id"].to_list() == [str(i) for i in range(n)]


def test_text_ids_at_one_time_are_named_in_the_traces_row_order(tmp_path) -> None:
    """Text ids ("b", "a", "c" in the trace's rows, all at t = 0) were named in the simulation table's text order:
    the file's first request (the trace's "b") took "a"'s id. With prompts of one length every pair was another
    request's, without a word; with other lengths the runs were refused as replays of different requests. The
    trace summary.json names gives the order; without it the order is unknown and refused."""
    from analysis.compare.comparison import name_positional_requests
    from analysis.compare.inputs import CompareInputError, load_run

    trace = tmp_path / "trace.parquet"
    save_trace(pl.DataFrame({"request_id": ["b", "a", "c"], "arrival_s": [0.0] * 3, "prompt_tokens": [64, 80, 96],
                             "output_tokens": [4] * 3}), trace)
    assert sim_main([str(trace), "--out", str(tmp_path / "sim"), "--quiet", "--no-report"]) == 0
    result = vllm_result() | {"input_lens": [64, 80, 96], "output_lens": [4] * 3, "ttfts": [0.05] * 3,
                              "itls": [[0.01] * 3] * 3, "errors": [""] * 3, "latencies": [0.08] * 3,
                              "start_times": [100.0] * 3, "num_prompts": 3, "completed": 3}
    real = load_run(_write(tmp_path / "inf.json", result), "real")
    named, _ = name_positional_requests(real, load_run(tmp_path / "sim", "sim"))
    pairs = dict(zip(named.requests["request_id"].to_list(), named.requests["prompt_tokens"].to_list()))
    assert pairs == {"b": 64, "a": 80, "c": 96}
    trace.unlink()
    with pytest.raises(CompareInputError, match="not numbers, so nothing says which of them the benchmark sent"):
        name_positional_requests(real, load_run(tmp_path / "sim", "sim"))


def test_a_result_that_is_not_a_regular_file(tmp_path) -> None:
    """A FIFO blocked the import forever (and /dev/zero filled memory until the process was killed)."""
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    for source in (fifo, Path("/dev/zero")):
        proc = subprocess.run([sys.executable, "-m", "analysis.vllm_import", str(source), "--out",
                               str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr == (f"error: {source}: not a readable JSON file (not a regular "
                                                        "file: a FIFO or a device)\n")
    assert not (tmp_path / "out").exists()


def test_a_trace_of_other_requests_is_refused(tmp_path, result_path) -> None:
    trace = tmp_path / "other.parquet"
    save_trace(pl.DataFrame({"request_id": ["a", "b", "c", "d"], "arrival_s": [0.0, 1.0, 2.0, 3.0],
                             "prompt_tokens": [5, 9, 11, 14], "output_tokens": [1, 1, 1, 1]}), trace)
    proc = subprocess.run([sys.executable, "-m", "analysis.vllm_import", str(result_path), "--out",
                           str(tmp_path / "out"), "--trace", str(trace)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: {result_path}: request 1 has 8 prompt tokens, row 1 of {trace} 9; "
                                   "expected the trace the benchmark replayed, in its order")


def test_limit_without_a_trace_is_refused(tmp_path, result_path, capsys) -> None:
    """--limit was ignored without --trace, without a word."""
    with pytest.raises(SystemExit) as exit_info:
        import_main([str(result_path), "--out", str(tmp_path / "out"), "--limit", "2"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: --limit applies to --trace (the trace's first N rows were replayed); "
                                       "pass --trace\n")
    assert not (tmp_path / "out").exists()


def test_resummarizing_keeps_the_recorded_duration(tmp_path, result_path) -> None:
    from analysis.summarize import main as summarize_main

    run_dir = tmp_path / "run"
    assert import_main([str(result_path), "--out", str(run_dir), "--quiet", "--no-report"]) == 0
    assert summarize_main([str(run_dir), "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["recorded_duration_s"] == summary["duration"] == DURATION_S
    assert summary["request_throughput"] == pytest.approx(3 / DURATION_S)


def test_a_result_file_may_start_with_a_byte_order_mark(tmp_path) -> None:
    """Re-saved by an editor (or PowerShell) with a BOM, the file was refused: 'Unexpected UTF-8 BOM'."""
    marked = tmp_path / "marked.json"
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps(vllm_result()).encode())
    plain = read_vllm_result(_write(tmp_path / "plain.json", vllm_result()))
    assert read_vllm_result(marked).requests.equals(plain.requests)
