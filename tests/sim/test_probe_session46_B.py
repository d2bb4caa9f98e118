"""Session 46 (helper B) probes of the sim tools.

- ``python -m sim.replay`` of a trace too large for the host's memory (5,000,000 requests of ShareGPT's lengths: about
  60 GB of request rows and token times by the time the outputs are written, ~13 KB a request measured) ran for many
  minutes and was then killed by the kernel's out-of-memory killer, with no word and no outputs. It is refused up
  front now, in one line saying how many of its first requests might fit (traces.requests.check_run_memory).
- A file the sim tools replace in place (``sim.calibrate PROFILE``, ``sim.fit_profile``, ``sim.host_speed
  --overwrite``) came back with the umask's permissions: a profile shared group-writable in a team's folder became
  writable by its owner alone after a calibration, and one made read-only became writable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import polars as pl
import pytest

import cli.sim_replay
from cli.sim_replay import main as sim_replay
from sim.config import SimConfig
from sim.files import write_text_atomic
from tests.sim.helpers import write_trace
from tests.traces.helpers import cli_error
from traces.requests import RequestMemoryError, check_run_memory
from traces.schema import load_trace


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mode", [0o664, 0o444, 0o600], ids=["group-writable", "read-only", "owner-only"])
def test_a_replaced_file_keeps_its_permissions(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{}\n")
    path.chmod(mode)
    write_text_atomic(path, '{"model": "qwen3-0.6b"}\n')
    assert path.read_text() == '{"model": "qwen3-0.6b"}\n'
    assert _mode(path) == mode
    assert os.listdir(tmp_path) == ["profile.json"]  # no staging file left beside it


def test_a_new_file_gets_the_umasks_permissions(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        write_text_atomic(tmp_path / "new.csv", "start_s,slowdown\n0,1\n")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "new.csv") == 0o640


# What check_run_memory counts at the least: per request, and per output token as the limits cut them.
PER_REQUEST, PER_TOKEN = 700, 24


def _resolved() -> object:
    config = SimConfig()  # qwen3-0.6b: max_model_len 40,960
    return config.resolved_for(config.model_shape)


def test_a_run_that_fits_is_not_refused(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path / "t.parquet", [10, 10, 10], [100, 200, 300]))
    need = 3 * PER_REQUEST + 600 * PER_TOKEN
    check_run_memory(trace, _resolved(), need)  # exactly enough
    check_run_memory(trace, _resolved(), None)  # not known: no check


def test_a_run_too_large_names_its_size_and_the_requests_that_might_fit(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.parquet", [10, 10, 10], [100, 200, 300])
    # After two requests: 2 * 700 + 300 * 24 = 8,600 bytes; all three: 16,500.
    with pytest.raises(RequestMemoryError) as error:
        check_run_memory(load_trace(path), _resolved(), 10_000)
    assert str(error.value) == (
        f"{path}: its 3 requests and their 600 output tokens (as the limits cut them) need at least 0.0 GiB to "
        "simulate and write, more than this host's 0.0 GiB available; expected a part of the trace (--limit of at "
        "most 2 requests) or a host with more memory")


def test_outputs_are_counted_as_the_limits_cut_them(tmp_path: Path) -> None:
    # A prompt past max_model_len is rejected unbuilt (no tokens); an output past it is cut at 40,960 - 10 tokens.
    trace = load_trace(write_trace(tmp_path / "t.parquet", [10, 50_000], [10**12, 10**12]))
    need = 2 * PER_REQUEST + (40_960 - 10) * PER_TOKEN
    check_run_memory(trace, _resolved(), need)
    with pytest.raises(RequestMemoryError, match="its 2 requests and their 40,950 output tokens"):
        check_run_memory(trace, _resolved(), need - 1)


def test_sim_replay_refuses_a_trace_too_large_before_making_its_folder(tmp_path: Path, capsys, monkeypatch) -> None:
    n = 5_000_000
    trace = tmp_path / "big.parquet"
    pl.DataFrame({"request_id": pl.int_range(n, eager=True), "arrival_s": pl.int_range(n, eager=True) / 1000.0,
                  "prompt_tokens": [161] * n, "output_tokens": [337] * n}).write_parquet(trace)
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: 16 * 2**30)
    out = tmp_path / "out"
    line = cli_error(sim_replay, [str(trace), "--out", str(out)], capsys)
    need_gib = (n * PER_REQUEST + n * 337 * PER_TOKEN) / 2**30
    fit = (16 * 2**30) // (PER_REQUEST + 337 * PER_TOKEN)
    assert line == (f"error: {trace}: its 5,000,000 requests and their 1,685,000,000 output tokens (as the limits cut "
                    f"them) need at least {need_gib:.1f} GiB to simulate and write, more than this host's 16.0 GiB "
                    f"available; expected a part of the trace (--limit of at most {fit:,} requests) or a host with "
                    "more memory")
    assert need_gib == pytest.approx(40.9, abs=0.05) and fit == 1_954_923
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet"]


# --bands: the main run is held until its outputs are written while band replays, each another whole run, run beside
# it; the pool had one per core whatever the memory.

def test_band_replays_run_beside_the_main_run_as_many_as_fit(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path / "t.parquet", [10, 10, 10], [100, 200, 300]))
    run = 3 * PER_REQUEST + 600 * PER_TOKEN  # 16,500 bytes
    assert check_run_memory(trace, _resolved(), 3 * run, num_replays=20, max_parallel_replays=8) == 2
    assert check_run_memory(trace, _resolved(), 100 * run, num_replays=20, max_parallel_replays=8) == 8
    assert check_run_memory(trace, _resolved(), None, num_replays=20, max_parallel_replays=8) == 8
    assert check_run_memory(trace, _resolved(), run) == 0  # no --bands: the main run alone fits
    with pytest.raises(RequestMemoryError) as error:
        check_run_memory(trace, _resolved(), 2 * run - 1, num_replays=20, max_parallel_replays=8)
    assert str(error.value) == (
        f"--bands 20: {trace.source} needs at least 0.0 GiB a run, and this host's 0.0 GiB available hold the main run "
        "alone, while each band replay is another whole run beside it; expected fewer requests (--limit) or no "
        "--bands")


def test_sim_replay_sizes_the_band_pool_by_memory(tmp_path: Path, capsys, monkeypatch) -> None:
    path = write_trace(tmp_path / "t.parquet", [10, 10, 10], [100, 200, 300])
    run = 3 * PER_REQUEST + 600 * PER_TOKEN
    jobs = []
    monkeypatch.setattr(cli.sim_replay, "run_bands_with_progress",
                        lambda trace, config, num_replays, num_jobs, slos, quiet: jobs.append(num_jobs) or None)
    monkeypatch.setattr("analysis.capacity.executors.default_num_jobs", lambda: 8)
    monkeypatch.setattr(cli.sim_replay, "max_steps_to_write", lambda available_bytes: None)  # (steps: not at issue)
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: 3 * run)
    assert sim_replay([str(path), "--bands", "20", "--out", str(tmp_path / "a"), "--quiet", "--no-report"]) == 0
    assert jobs == [2]  # two replays beside the main run, not eight
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: 2 * run - 1)
    line = cli_error(sim_replay, [str(path), "--bands", "20", "--out", str(tmp_path / "b")], capsys)
    assert line.startswith("error: --bands 20: ") and line.endswith("expected fewer requests (--limit) or no --bands")
    assert not (tmp_path / "b").exists()
