"""Hostile input to the benchmark scripts (benchmarks/*.py): exit 2 with one line naming the option, no traceback,
refused before any work (no simulation, sweep, torch or GPU), --json never written over an input nor left in part.

Each case runs the script as a user would, in a child process (in its own session, so that a timeout kills what
it started too); each was a traceback, a silent wrong answer, or a failure only after the whole run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"
# Every refusal below comes within seconds (imports only); the limit is for a script that would start the work.
TIMEOUT_S = 60


def run_script(argv: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and anything it started (workers, engine replays)
        proc.communicate()
        pytest.fail(f"{' '.join(argv)} still ran after {TIMEOUT_S} s: the input was not refused up front")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def refused(argv: list[str], message: str) -> str:
    """Run a script on bad input: exit 2, one error line (argparse's usage lines may come before it) holding
    ``message``, no traceback. Returns the error line."""
    proc = run_script(argv)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error: " in line]
    assert len(errors) == 1 and lines and lines[-1] == errors[0], proc.stderr
    assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), proc.stderr
    assert message in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture
def azure_csv(tmp_path) -> Path:
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    return path


@pytest.fixture
def trace_copy(tmp_path) -> Path:
    path = tmp_path / "trace.parquet"
    shutil.copyfile(SHAREGPT, path)
    return path


# --- --json: checked before the run, never an input, written whole -------------------------------------------------

def test_json_onto_the_trace_is_refused_and_the_trace_left_alone(tmp_path, trace_copy, azure_csv):
    cases = [
        (["benchmarks/bench_client.py", str(trace_copy), "--limit", "5", "--json", str(trace_copy)], trace_copy),
        (["benchmarks/sim_speed.py", "--trace", str(azure_csv), "--no-pin", "--json", str(azure_csv)], azure_csv),
        (["benchmarks/sim_instructions.py", "--trace", str(azure_csv), "--limit", "2", "--json", str(azure_csv)],
         azure_csv),
        (["benchmarks/sim_bytecodes.py", "--trace", str(azure_csv), "--limit", "2", "--json", str(azure_csv)],
         azure_csv),
        (["benchmarks/serving.py", "--trace", str(trace_copy), "--json", str(trace_copy)], trace_copy),
    ]
    for argv, source in cases:
        before = source.read_bytes()
        refused(argv, f"--json {source} is one of the inputs")
        assert source.read_bytes() == before, argv[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["azure.csv", "trace.parquet"]


def test_json_onto_the_shipped_model_config_is_refused():
    config = REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json"
    before = config.read_bytes()
    refused(["benchmarks/throughput.py", "--json", str(config)], "--json")
    assert config.read_bytes() == before


JSON_SCRIPTS = [
    ["benchmarks/bench_client.py", "{trace}", "--limit", "5"],
    ["benchmarks/sim_speed.py", "--trace", "{trace}", "--no-pin"],
    ["benchmarks/sim_million.py", "--requests", "100"],
    ["benchmarks/capacity_speed.py", "--jobs", "1"],
    ["benchmarks/sim_instructions.py", "--trace", "{trace}", "--limit", "2"],
    ["benchmarks/sim_bytecodes.py", "--trace", "{trace}", "--limit", "2"],
    ["benchmarks/steady_capacity.py", "--parts", "default", "--seeds", "1", "--jobs", "1"],
    ["benchmarks/throughput.py", "--num-seqs", "1"],
    ["benchmarks/serving.py", "--trace", "{trace}", "--probes", "1"],
]


@pytest.mark.parametrize("argv", JSON_SCRIPTS, ids=[a[0].split("/")[1] for a in JSON_SCRIPTS])
@pytest.mark.parametrize(("out", "message"), [
    ("{tmp}/folder", "--json {tmp}/folder is a directory; expected a file path"),
    ("{tmp}/new/", "--json {tmp}/new/ ends with '/', a folder; expected a file path"),
    ("", "--json is empty; expected a file path"),
], ids=["a folder", "a trailing slash", "empty"])
def test_a_json_that_cannot_take_a_file_is_refused_before_the_run(tmp_path, trace_copy, argv, out, message):
    (tmp_path / "folder").mkdir()
    argv = [a.replace("{trace}", str(trace_copy)) for a in argv] + ["--json", out.replace("{tmp}", str(tmp_path))]
    refused(argv, message.replace("{tmp}", str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "trace.parquet"]  # nothing written
    assert list((tmp_path / "folder").iterdir()) == []


def test_json_in_a_missing_folder_is_made_and_written_whole(tmp_path):
    out = tmp_path / "new" / "deeper" / "figures.json"
    proc = run_script(["benchmarks/sim_million.py", "--requests", "200", "--replicas", "1", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["num_requests"] == 200
    assert [p.name for p in out.parent.iterdir()] == ["figures.json"]  # no partial file beside it


# --- options each script refused late, or not at all ----------------------------------------------------------------

THROUGHPUT_CASES = [
    (["--block-size", "3"], "--block-size: block_size must be a power of two from 16 to 256, got 3"),
    (["--block-size", "0"], "--block-size: block_size must be a power of two"),
    (["--max-input-len", "50"], "--max-input-len must be >= 100"),
    (["--max-input-len", "0"], "--max-input-len must be >= 100"),
    (["--max-output-len", "-1"], "--max-output-len must be >= 100"),
    (["--max-output-len", "99"], "--max-output-len must be >= 100"),
    (["--max-model-len", "1000"], "--max-model-len 1000 is below the longest request the workload may draw "
                                  "(--max-input-len 1024 + --max-output-len 1024 = 2048 tokens)"),
    (["--max-model-len", "0"], "--max-model-len: max_model_len must be an integer >= 1, got 0"),
    (["--max-model-len", "100000"], "--max-model-len 100000 is more than qwen3-0.6b's max_position_embeddings"),
    (["--tensor-parallel-size", "3"], "--tensor-parallel-size: qwen3-0.6b: attention heads (16) is not divisible"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens: max_num_batched_tokens must be an integer >= 1"),
    (["--policy", "nano", "--max-num-batched-tokens", "512"], "--max-input-len 1024 is above --max-num-batched-tokens"),
    (["--max-cuda-graph-tokens", "-1"], "--max-cuda-graph-tokens: max_cuda_graph_tokens must be an integer >= 0"),
    (["--model", "no-such-model"], "--model no-such-model: model 'no-such-model' is neither"),
]


@pytest.mark.parametrize(("args", "message"), THROUGHPUT_CASES, ids=[" ".join(a) for a, _ in THROUGHPUT_CASES])
def test_throughput_refuses_what_the_engine_or_the_workload_cannot_run(args, message):
    refused(["benchmarks/throughput.py", *args], message)


def test_throughput_refuses_a_model_whose_vocabulary_the_token_ids_overrun(tmp_path):
    config = json.loads((REPO / "engine" / "configs" / "qwen3-0.6b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 1000, "eos_token_id": 999}))
    refused(["benchmarks/throughput.py", "--model", str(tmp_path)],
            f"--model {tmp_path}: vocab_size 1000; the workload's token ids go up to 10000")


@pytest.mark.parametrize("content", [b"garbage\n", b"PAR1" + b"\0" * 64], ids=["text", "damaged parquet"])
@pytest.mark.parametrize("script", ["benchmarks/sim_speed.py", "benchmarks/sim_instructions.py"])
def test_sim_speed_and_instructions_refuse_a_bad_trace(tmp_path, script, content):
    for name in ("bad.parquet", "bad.csv", "bad.jsonl"):
        (tmp_path / name).write_bytes(content)
        refused([script, "--trace", str(tmp_path / name)], f"{tmp_path / name}")


@pytest.mark.parametrize("script", ["benchmarks/sim_speed.py", "benchmarks/sim_instructions.py"])
def test_sim_speed_and_instructions_refuse_a_missing_trace_or_a_folder(tmp_path, script):
    refused([script, "--trace", str(tmp_path / "none.csv")], f"{tmp_path / 'none.csv'}")
    (tmp_path / "folder.parquet").mkdir()
    refused([script, "--trace", str(tmp_path / "folder.parquet")], f"{tmp_path / 'folder.parquet'}")


@pytest.mark.parametrize(("args", "message"), [
    (["--qps", "inf"], "--qps must be a finite number > 0, got inf"),
    (["--block-size", "3"], "--block-size: block_size must be a power of two"),
    (["--num-gpu-blocks", "0"], "--num-gpu-blocks: num_gpu_blocks must be an integer >= 1"),
    (["--top", "0"], "--top must be >= 1, got 0"),
])
def test_sim_speed_refuses_bad_options_before_reading_the_trace(tmp_path, args, message):
    # The trace is a folder: an option checked only after reading it would be named second, or not at all.
    (tmp_path / "folder.csv").mkdir()
    refused(["benchmarks/sim_speed.py", "--no-pin", "--trace", str(tmp_path / "folder.csv"), *args], message)


@pytest.mark.parametrize("seed", ["-1", "-5"])
def test_sim_million_refuses_a_negative_seed(seed):
    refused(["benchmarks/sim_million.py", "--requests", "100", "--seed", seed], f"--seed must be an integer >= 0, "
                                                                                 f"got {seed}")


STEADY_CASES = [  # each ran the default part (minutes) first, or failed in the sweep's own parser
    (["--reference-centres", "abc"], "--reference-centres 'abc': 'abc' is not an integer; expected REPLICAS=QPS"),
    (["--reference-centres", "1=abc"], "--reference-centres '1=abc': 'abc' is not a number"),
    (["--reference-centres", "1=34.4,2=0"], "--reference-centres '2=0': 0 must be a finite number > 0"),
    (["--reference-centres", "1=nan"], "--reference-centres '1=nan': nan must be a finite number > 0"),
    (["--reference-centres", "0=30"], "--reference-centres '0=30': 0 must be >= 1"),
    (["--reference-centres", "1=30,1=40"], "--reference-centres '1=40': 1 replica(s) given twice"),
    (["--jobs", "0"], "argument --jobs: 0 must be >= 1"),
    (["--jobs", "-1"], "argument --jobs: -1 must be >= 1"),
    (["--seeds", "0"], "argument --seeds: 0 must be >= 1"),
    (["--duration-seeds", "0"], "argument --duration-seeds: 0 must be >= 1"),
    (["--seed-offset", "-1"], "argument --seed-offset: -1 must be >= 0"),
    (["--reference-duration", "nan"], "argument --reference-duration: nan must be a finite number >= 0"),
    (["--reference-span", "1.5"], "--reference-span must be a share from 0.001 to below 1, got 1.5"),
    (["--reference-span", "nan"], "--reference-span must be a share from 0.001 to below 1, got nan"),
    (["--reference-tolerance", "0"], "--reference-tolerance must be from 0.0001 to below 1, got 0.0"),
    (["--reference-tolerance", "nan"], "--reference-tolerance must be from 0.0001 to below 1, got nan"),
    (["--parts", "reference"], "--parts reference without default has nothing to bracket"),
]


@pytest.mark.parametrize(("args", "message"), STEADY_CASES, ids=[" ".join(a) for a, _ in STEADY_CASES])
def test_steady_capacity_refuses_bad_options_before_the_first_search(tmp_path, args, message):
    refused(["benchmarks/steady_capacity.py", *args, "--json", str(tmp_path / "figures.json")], message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not valid JSON"),
    ("[1, 2]", "top level is a JSON array; expected an object"),
    ('{"default": [1]}', "'default' is a JSON array; expected an object"),
    ('{"default": {"configs": {"1": 3}}}', "'default.configs' is not an object of objects"),
], ids=["text", "a list", "default a list", "configs of numbers"])
def test_steady_capacity_refuses_a_json_it_did_not_write_and_leaves_it(tmp_path, content, message):
    path = tmp_path / "figures.json"
    path.write_text(content)
    refused(["benchmarks/steady_capacity.py", "--parts", "default", "--json", str(path)], f"--json {path}: {message}")
    assert path.read_text() == content


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0"])
def test_serving_refuses_a_ttft_limit_that_is_not_a_finite_positive_number(value):
    refused(["benchmarks/serving.py", "--ttft-p90-ms", value], "--ttft-p90-ms must be a finite number of "
                                                               "milliseconds > 0")


def test_serving_refuses_an_unknown_model_before_making_the_trace():
    refused(["benchmarks/serving.py", "--model", "no-such-model"], "--model no-such-model: model 'no-such-model'")


@pytest.mark.parametrize(("args", "message"), [
    (["--max-concurrency", "0"], "--max-concurrency must be >= 1 (or left out: no cap), got 0"),
    (["--max-concurrency", "-3"], "--max-concurrency must be >= 1 (or left out: no cap), got -3"),
    (["--qps", "nan"], "--qps must be a finite number > 0, got nan"),
])
def test_bench_client_refuses_a_cap_of_no_requests(trace_copy, args, message):
    refused(["benchmarks/bench_client.py", str(trace_copy), "--limit", "5", *args], message)


@pytest.mark.parametrize("jobs", ["0", "-2", "x"])
def test_capacity_speed_refuses_bad_jobs_before_the_sweep(jobs):
    refused(["benchmarks/capacity_speed.py", "--jobs", jobs], "argument --jobs:")
