"""Probe T (session 27): analysis.compare, analysis.capacity and the trace readers under hostile input.

What the probe found:

- analysis.compare of two runs of the same request ids and prompt lengths whose requests arrive at other times (two
  traces synthesized or converted from one source at other --qps, each replayed as it is) compared the loads, not the
  simulator, at exit 0 and without a word: 200 ShareGPT-shaped requests at 5 and 20 req/s read as TTFT p90 +9 %, TPOT
  p90 +11 %, and no config difference was printed (both runs were replayed without --qps). Now such runs are refused
  as runs of different requests are, unless their configs record another --qps, --time-scale or --offline (printed as
  a config difference) or --allow-different-requests is given.
- A sparse 100 GB file named as a trace (traces.info, sim.replay, analysis.capacity) was read whole into memory
  before arrow looked at its footer: the command held all of the machine's memory until it was killed. Now a file
  that does not end as a parquet file does is refused from its last bytes, in arrow's words.
- analysis.capacity --gpu-cost with a JSON file nested thousands deep was a RecursionError traceback, and one holding
  a price of 5000 digits printed Python's "Exceeds the limit (4300 digits) ... sys.set_int_max_str_digits()" without
  the file's name.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analysis.capacity.cli import main as capacity_main
from analysis.compare.cli import main as compare_main
from tests.analysis.frames import requests_frame
from tests.analysis.test_compare import real_requests, real_steps, write_run
from tests.traces.helpers import cli_error

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "traces" / "sharegpt.parquet"


def _at_times(requests: pl.DataFrame, scale: float, origin_s: float = 0.0) -> pl.DataFrame:
    """The same requests arriving ``scale`` times as far apart (from ``origin_s``), each answered as fast."""
    rows = []
    for row in requests.iter_rows(named=True):
        shift = origin_s + row["arrival_s"] * (scale - 1)
        rows.append({**row, **{key: row[key] + shift for key in ("arrival_s", "first_scheduled_s", "first_token_s",
                                                                 "finish_s")},
                     "token_times_s": [t + shift for t in row["token_times_s"]]})
    return requests_frame(rows)


def _compare(tmp_path: Path, scale: float, origin_s: float = 0.0, real_config: dict | None = None,
             extra: tuple[str, ...] = ()) -> list[str]:
    real = write_run(tmp_path / "real", real_requests(), real_steps(), {"config": real_config or {}})
    sim = write_run(tmp_path / "sim", _at_times(real_requests(), scale, origin_s), real_steps(),
                    {"cost_model": "roofline-estimate", "config": {}})
    return [str(real), str(sim), "--out", str(tmp_path / "out"), "--no-report", *extra]


def test_compare_refuses_the_same_requests_arriving_at_other_times(tmp_path, capsys):
    argv = _compare(tmp_path, scale=4.0)  # r0, r1, r2 at 0, 1, 2 s in the real run; at 0, 4, 8 s in the simulation
    line = cli_error(compare_main, argv, capsys)
    assert line == (f"error: {tmp_path / 'real'} and {tmp_path / 'sim'} are runs of requests that arrive at other "
                    "times: 2 of the 3 they share arrive more than 1 ms apart, counted from each run's first arrival "
                    "(the first, 'r1', at 1 s real and 4 s sim), with the same --qps, --time-scale and --offline "
                    "(traces made at other rates?); compare replays of the same trace, or pass "
                    "--allow-different-requests")
    assert not (tmp_path / "out").exists()
    assert compare_main(argv + ["--allow-different-requests"]) == 0  # asked for


def test_compare_takes_other_arrivals_a_config_records_and_a_clock_that_starts_elsewhere(tmp_path, capsys):
    # The real run was replayed at --qps 0.25 (and says so): its config difference is printed beside the table.
    assert compare_main(_compare(tmp_path / "qps", scale=4.0, real_config={"qps": 0.25})) == 0
    assert "config differences: qps real=0.25 sim=None" in capsys.readouterr().out
    # The same arrivals on a clock that starts 1000 s later.
    assert compare_main(_compare(tmp_path / "clock", scale=1.0, origin_s=1000.0)) == 0


def _limited_memory() -> None:
    """2 GiB of address space: a command that reads the sparse file whole fails there instead of taking the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))


@pytest.mark.parametrize("command", [["traces.info"], ["analysis.capacity", "--slo", "ttft_p90=1s", "--quiet"]],
                         ids=["info", "capacity"])
def test_a_sparse_file_named_as_a_trace_is_refused_unread(tmp_path, command):
    trace = tmp_path / "huge.parquet"
    with open(trace, "wb") as f:  # sparse: no disk, and it was read whole (100 GB)
        f.truncate(100 * 2**30)
    argv = [sys.executable, "-m", command[0], str(trace), *command[1:]]
    if command[0] == "analysis.capacity":
        argv += ["--out", str(tmp_path / "out")]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, preexec_fn=_limited_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command[0]} was still reading a sparse 100 GB trace after 60 s")
    prefix = "TRACE: " if command[0] == "analysis.capacity" else ""
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: {prefix}{trace}: not a readable parquet file (Parquet magic bytes not found in footer. Either the "
        "file is corrupted or this is not a parquet file.); expected a trace written by save_trace")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("content", "problem"), [
    ('{"h200": ' + "[" * 100_000 + "]" * 100_000 + "}", "arrays or objects nested too deeply"),  # a traceback
    ('{"h200": ' + "9" * 5000 + "}", "a number of more than 4300 digits"),  # named no file
], ids=["nested", "digits"])
def test_capacity_gpu_cost_file_json_it_cannot_read_names_the_file(tmp_path, capsys, content, problem):
    prices = tmp_path / "prices.json"
    prices.write_text(content)
    argv = [str(TRACE), "--slo", "ttft_p90=1s", "--gpu-cost", str(prices), "--out", str(tmp_path / "out"), "--quiet"]
    line = cli_error(capacity_main, argv, capsys)
    assert line == f"error: --gpu-cost: {prices}: not valid JSON ({problem})"
    assert not (tmp_path / "out").exists()
