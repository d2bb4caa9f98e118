"""Probe K (session 22): interoperability with the result files vLLM's and SGLang's benchmark clients write.

The files below are laid out as the clients write them (key for key, value for value):

* ``vllm bench serve`` (vllm-project/vllm, vllm/benchmarks/serve.py) writes ``"burstiness": args.burstiness``
  with ``json.dump`` (allow_nan on), so ``--burstiness inf`` (a constant gap, a case get_request handles on
  purpose) is the JSON token ``Infinity``; it writes ``request_rate`` as the string ``"inf"`` itself.
* ``python -m sglang.bench_serving`` (sgl-project/sglang, python/sglang/bench_serving.py) writes
  ``"request_rate": request_rate`` with ``json.dumps``, and its default rate is ``inf``: ``Infinity`` in every
  file of a default run. It appends one JSON line per run to a ``.jsonl`` file, and writes no ``latencies`` and no
  ``start_times``.
* A failed request of either (vllm/benchmarks/lib/endpoint_request_func.py) keeps the defaults ttft 0.0, itl [],
  output length 0, and its error is ``response.reason or ""``: an HTTP error answered without a reason phrase is
  a failure with an empty error string.

Each test failed before its fix and names what it guards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analysis.vllm_import import main as import_main
from analysis.vllm_import import read_vllm_result

REPO = Path(__file__).resolve().parents[2]


def _vllm_file(**overrides) -> dict:
    """Three requests as vLLM's current client records them; the second failed (HTTP 500)."""
    data = {"date": "20261201-120000", "endpoint_type": "openai", "backend": "openai", "label": None,
            "model_id": "m", "tokenizer_id": "m", "num_prompts": 3, "request_rate": "inf", "burstiness": 1.0,
            "max_concurrency": None, "duration": 2.0, "completed": 2, "failed": 1, "total_input_tokens": 12,
            "total_output_tokens": 4, "request_goodput": None,
            "input_lens": [5, 6, 7], "output_lens": [3, 0, 1], "ttfts": [0.1, 0.0, 0.2], "itls": [[0.01, 0.02], [], []],
            "latencies": [0.13, 0.0, 0.2], "start_times": [10.0, 10.1, 10.2], "queue_times": [0.0, 0.0, 0.0],
            "generated_texts": ["a b c", "", "d"], "errors": ["", "Internal Server Error", ""]}
    return data | overrides


def _sglang_line(**overrides) -> str:
    """One run of sglang.bench_serving --output-details at its default rate, as the JSONL line it appends."""
    data = {"backend": "sglang-oai", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": None,
            "sharegpt_output_len": None, "random_input_len": 5, "random_output_len": 3, "random_range_ratio": 1.0,
            "duration": 2.0, "completed": 2, "total_input_tokens": 12, "total_output_tokens": 4,
            "total_output_tokens_retokenized": 4, "request_throughput": 1.0, "mean_ttft_ms": 150.0,
            "concurrency": 0.1, "accept_length": None,
            "input_lens": [5, 6, 7], "output_lens": [3, 0, 1], "ttfts": [0.1, 0.0, 0.2], "itls": [[0.01, 0.02], [], []],
            "generated_texts": ["a b c", "", "d"], "errors": ["", "Traceback ...\nClientConnectorError", ""]}
    return json.dumps(data | overrides) + "\n"


def test_vllm_burstiness_inf_is_read_as_vllm_writes_its_infinite_rate(tmp_path) -> None:
    """vLLM writes --burstiness inf as the JSON token Infinity: the file was refused ("'burstiness' is NaN or
    Infinity"), the one key of the file's config that vLLM itself can write that way."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_vllm_file(burstiness=float("inf"), request_rate=4.0)))
    assert "Infinity" in path.read_text()
    run = read_vllm_result(path)
    assert run.meta["config"]["burstiness"] == "inf" and run.meta["config"]["request_rate"] == 4.0
    out = tmp_path / "run"
    assert import_main([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["burstiness"] == "inf"


def test_a_nan_in_the_config_is_still_refused(tmp_path, capsys) -> None:
    """Neither client can write NaN there (both assert a positive rate and burstiness): still one line, exit 2."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_vllm_file(burstiness=float("nan"))))
    with pytest.raises(SystemExit) as exit_info:
        import_main([str(path), "--out", str(tmp_path / "run"), "--quiet", "--no-report"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (f"error: {path}: 'burstiness' is NaN or Infinity; expected a finite number, "
                                       "a string or null\n")
    assert not (tmp_path / "run").exists()


def test_an_sglang_result_at_its_default_infinite_rate_is_read(tmp_path) -> None:
    """SGLang writes its default rate as Infinity: every default run's file was refused ("'request_rate' is NaN or
    Infinity"). Without latencies or start_times, E2E is TTFT plus the gaps and every request is at t = 0."""
    path = tmp_path / "sglang-oai_1201_3_5_3.jsonl"
    path.write_text(_sglang_line())
    run = read_vllm_result(path)
    frame = run.requests
    assert run.meta["config"]["request_rate"] == "inf" and run.meta["config"]["backend"] == "sglang-oai"
    assert frame["finish_reason"].to_list() == ["length", "error", "length"]
    assert frame["arrival_s"].to_list() == [0.0, 0.0, 0.0]
    assert frame["token_times_s"].to_list() == [pytest.approx([0.1, 0.11, 0.13]), [], pytest.approx([0.2])]
    assert frame["finish_s"].to_list() == pytest.approx([0.13, 0.0, 0.2])
    assert frame["output_tokens"].to_list() == [3, 0, 1]


def test_compare_reads_sglangs_jsonl_result_in_place(tmp_path) -> None:
    """analysis.compare took a result file only when its name ended in .json: SGLang's own file name (.jsonl) was
    "not a directory (expected a replay output folder or a vllm bench serve result .json)"."""
    path = tmp_path / "sglang.jsonl"
    path.write_text(_sglang_line(request_rate=2.0))
    out = tmp_path / "same"
    assert import_main([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    proc = subprocess.run([sys.executable, "-m", "analysis.compare", str(path), str(out), "--out",
                           str(tmp_path / "cmp"), "--no-report"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cmp").is_dir()


def test_a_failure_with_an_empty_reason_phrase_is_a_failure(tmp_path) -> None:
    """vLLM records an HTTP error answered without a reason phrase as error "" beside ttft 0.0, no gaps and output
    length 0 (its RequestFuncOutput defaults): the whole file was refused ("'itls' item 1 has 0 gaps (1 streamed
    chunks), 'output_lens' item 1 0"), though vLLM counted it as failed (completed 2, failed 1)."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_vllm_file(errors=["", "", ""])))
    frame = read_vllm_result(path).requests
    assert frame["finish_reason"].to_list() == ["length", "error", "length"]
    assert frame["error"].to_list() == [None, "failed (the file records no first token and no error message)", None]
    assert frame["first_token_s"].to_list() == pytest.approx([0.1, None, 0.4])
    out = tmp_path / "run"
    assert import_main([str(path), "--out", str(out), "--quiet", "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert pl.read_parquet(out / "requests.parquet")["output_tokens"].to_list() == [3, 0, 1]


def test_a_success_with_a_first_token_is_kept_even_with_an_empty_error(tmp_path) -> None:
    """The rule above takes only what vLLM's defaults leave: a first token (ttft > 0) is a success."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_vllm_file()))
    frame = read_vllm_result(path).requests
    assert frame["finish_reason"].to_list() == ["length", "error", "length"]
    assert frame["error"].to_list() == [None, "Internal Server Error", None]


def test_a_file_of_appended_runs_says_so(tmp_path, capsys) -> None:
    """vLLM's --append-result and SGLang's bench_serving append a JSON line per run: the refusal read "not a
    readable JSON file (Extra data: line 2 column 1 (char 1093))", not what the file holds nor what to do."""
    path = tmp_path / "sglang.jsonl"
    path.write_text(_sglang_line() + _sglang_line())
    with pytest.raises(SystemExit) as exit_info:
        import_main([str(path), "--out", str(tmp_path / "run"), "--quiet", "--no-report"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {path}: holds more than one result (a JSON value ends on line 1 and another follows: runs appended "
        "by --append-result or SGLang's bench_serving); expected one run: keep that run's line in a file of its own\n")
    assert not (tmp_path / "run").exists()
