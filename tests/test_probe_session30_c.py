"""Hostile input to the command lines (session 30, probe C): exit 2 with one line naming the file, column or option
and what was expected, no traceback, nothing written. Each case failed before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.traces.helpers import REPO_ROOT

TIMEOUT_S = 60


def one_error_line(argv: list[str]) -> str:
    """Run ``python -m ...`` as a user would: exit 2 and one error line, no traceback. Returns the line."""
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "panicked" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def _five_requests(**columns: pa.Array) -> pa.Table:
    return pa.table({"request_id": pa.array([f"r{i}" for i in range(5)]), "arrival_s": pa.array([0.0, 1, 2, 3, 4]),
                     "prompt_tokens": pa.array([10] * 5, pa.int64()), "output_tokens": pa.array([5] * 5, pa.int64()),
                     **columns})


# --- a trace column of 256-bit decimals -------------------------------------------------------------------------------

@pytest.mark.parametrize(("column", "array", "expected"), [
    ("arrival_s", pa.array([0, 1, 2, 3, 4], pa.decimal256(40, 2)), "expected float64 seconds"),
    ("prompt_tokens", pa.array([10] * 5, pa.decimal256(40, 0)), "expected integers >= 1"),
    ("request_id", pa.array(range(5), pa.decimal256(40, 0)), "expected int64 or utf8 (string)"),
    ("session_id", pa.array([1] * 5, pa.decimal256(40, 0)), "expected int64 or utf8 (nullable)"),
    ("prompt_token_ids", pa.array([[("a", 1)]] * 5, pa.map_(pa.string(), pa.decimal256(40, 0))),
     "expected a list of integers (token ids >= 0)"),
])
def test_a_trace_column_of_256_bit_decimals_is_named_not_a_polars_panic(tmp_path: Path, column: str,
                                                                        array: pa.Array, expected: str) -> None:
    """An extra column of decimal256 was left out (session 22), but one of the trace's own columns still reached
    polars' conversion, which panicked: a Rust backtrace and a ~90-line pyo3 PanicException traceback at exit 1."""
    path = tmp_path / "t.parquet"
    table = _five_requests()
    table = table.set_column(table.schema.get_field_index(column), column, array) if column in table.column_names \
        else table.append_column(column, array)
    pq.write_table(table, path)
    line = one_error_line(["sim.replay", str(path), "--out", str(tmp_path / "run"), "--no-report", "--quiet"])
    assert line.startswith(f"error: {path}: column {column!r} has type ") and "256-bit decimal" in line
    assert line.endswith(expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


# --- sim.profile --sampling-only on another device than the profile's -------------------------------------------------

def test_sampling_only_refuses_to_add_another_devices_times_to_a_profile(tmp_path: Path) -> None:
    """--sampling-only checked the profile's model, GPU name and tensor-parallel size, not the device: --device cpu
    (or an H100) wrote its sampling times, in seconds, into an H200 profile, which then priced every sampled step
    with them. Refused before the model loads; the profile is left as it was."""
    shipped = REPO_ROOT / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"
    out = tmp_path / "profile.json"
    out.write_bytes(shipped.read_bytes())
    line = one_error_line(["sim.profile", "--sampling-only", "--device", "cpu", "--model", "qwen3-0.6b", "--gpu",
                           "h200", "--quick", "--repeats", "1", "--out", str(out)])
    assert line == (f"error: --out {out} was measured on NVIDIA H200, and --device cpu measures on cpu; "
                    "--sampling-only adds points measured on the profile's own device")
    assert out.read_bytes() == shipped.read_bytes() and [p.name for p in tmp_path.iterdir()] == ["profile.json"]


# --- analysis.compare given a Mooncake trace --------------------------------------------------------------------------

def test_compare_of_a_mooncake_trace_says_it_is_a_trace_not_appended_runs(tmp_path: Path) -> None:
    """A .jsonl is read as a vllm bench serve (or SGLang) result; a Mooncake trace, JSON Lines too, was refused as
    'holds more than one result ... runs appended by --append-result or SGLang's bench_serving; keep that run's line
    in a file of its own', advice that made a trace of one of its lines. A file of appended results still says so."""
    record = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(record * 3)
    other = tmp_path / "other.jsonl"
    other.write_text(record * 3)
    line = one_error_line(["analysis.compare", str(trace), str(other), "--out", str(tmp_path / "cmp"), "--no-report"])
    assert line.startswith(f"error: {trace}: holds several JSON values, the first of which is no vllm bench serve "
                           "result (no 'input_lens', 'output_lens', 'ttfts', 'itls'); it looks like a mooncake trace")
    assert f"python -m traces.convert mooncake {trace} -o TRACE.parquet" in line and "appended" not in line
    result = '{"input_lens": [5], "output_lens": [2], "ttfts": [0.1], "itls": [[0.01]], "duration": 1.0}\n'
    appended = tmp_path / "results.jsonl"
    appended.write_text(result * 2)
    line = one_error_line(["analysis.compare", str(appended), str(other), "--out", str(tmp_path / "cmp"),
                           "--no-report"])
    assert line.startswith(f"error: {appended}: holds more than one result")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mooncake.jsonl", "other.jsonl", "results.jsonl"]
