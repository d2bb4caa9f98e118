"""Defects found by probing sim.replay and the trace tools with hostile input: each case failed before its fix."""

from __future__ import annotations

import pytest

import cli.sim_replay
import sim.simulator
import traces.requests
from cli.sim_replay import main as replay_main
from tests.sim.helpers import write_trace
from tests.traces.helpers import cli_error

# The limits a what-if lifts far beyond any GPU's: a request of billions of tokens is then admitted.
LIFTED_LIMITS = ["--allow-long-max-model-len", "--max-model-len", "20000000000", "--num-gpu-blocks", "2000000000"]


def test_a_prompt_too_long_to_synthesise_is_one_error_line_and_no_run(tmp_path, capsys, monkeypatch):
    """A request the what-if limits admit (--allow-long-max-model-len, --num-gpu-blocks far beyond the GPU's) with a
    prompt of ten billion tokens: synthesising it raised numpy's MemoryError ('Unable to allocate 128. GiB') at its
    arrival, a traceback with exit 1. The host's refusal is stood in for here, so no test allocates that much."""
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 128. GiB for an array with shape (17179869184,) and data type uint64")

    monkeypatch.setattr(traces.requests, "tokens_from_row_array", no_memory)
    monkeypatch.setattr(sim.simulator, "host_memory_available", lambda: None)  # the up-front checks cannot tell
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: None)
    trace = write_trace(tmp_path / "long.parquet", [10_000_000_000], [2])
    out = tmp_path / "out"
    line = cli_error(replay_main, [str(trace), *LIFTED_LIMITS, "--quiet", "--no-report", "--out", str(out)], capsys)
    assert line == (f"error: {trace}: row 0 (request_id 0): its prompt of 10,000,000,000 tokens does not fit in this "
                    "host's memory to be synthesised; expected a prompt the limits reject (a smaller --max-model-len "
                    f"or --num-gpu-blocks) or a trace without it (--limit); nothing written to {out}")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["long.parquet"], "a staging folder was left behind"


@pytest.mark.parametrize("progress", [True, False])
def test_the_prompt_error_starts_a_line_of_its_own_after_the_progress_bar(tmp_path, capsys, monkeypatch, progress):
    """Without --quiet the error was written after the progress bar's unfinished line (tqdm was never closed)."""
    def no_memory(*args, **kwargs):
        raise MemoryError("no memory")

    monkeypatch.setattr(traces.requests, "tokens_from_row_array", no_memory)
    monkeypatch.setattr(traces.requests, "tokens_from_rows_into", no_memory)  # (a short row: made with those after it)
    trace = write_trace(tmp_path / "t.parquet", [100], [2])
    argv = [str(trace), "--no-report", "--out", str(tmp_path / "out")] + ([] if progress else ["--quiet"])
    with pytest.raises(SystemExit) as exc:
        replay_main(argv)
    assert exc.value.code == 2
    last = capsys.readouterr().err.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"error: {trace}: row 0 (request_id 0): its prompt of 100 tokens does not fit")


def test_replay_names_a_qps_too_small_in_its_own_terms(tmp_path, capsys):
    """sim.replay --qps 1e-300 was refused as "time scale 1e+300 stretches ... (a smaller scale or a larger qps)",
    naming a --time-scale it was not given."""
    trace = write_trace(tmp_path / "t.parquet", [10, 10], [2, 2], arrival_s=[0.0, 1.0])
    line = cli_error(replay_main, [str(trace), "--qps", "1e-300", "--quiet", "--out", str(tmp_path / "out")], capsys)
    assert line == (f"error: {trace}: qps 1e-300 is too small: it spreads the 2 requests over 1e+300 s (the "
                    "trace runs at 1 requests/s); expected at most 1e+12 s from the trace start to its "
                    "last arrival (a larger qps)")


def test_a_request_too_long_to_simulate_in_this_host_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """With the limits lifted for a what-if, a row asking for ten billion output tokens ran on for as long as it was
    let (its token times growing towards 120 GB); it is now refused before the run, naming its row (by sim.replay
    before its output folder is made, session 46)."""
    monkeypatch.setattr(sim.simulator, "host_memory_available", lambda: 8 * 2**30)
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: 8 * 2**30)
    trace = write_trace(tmp_path / "t.parquet", [100, 100], [5, 10_000_000_000])
    out = tmp_path / "out"
    line = cli_error(replay_main, [str(trace), *LIFTED_LIMITS, "--quiet", "--no-report", "--out", str(out)], capsys)
    assert line == (f"error: {trace}: row 1 (request_id 1): its 10,000,000,100 tokens (prompt and output, as the "
                    "limits cut them) need 111.8 GiB to simulate, more than this host's 8.0 GiB available; expected "
                    "requests the limits cut shorter (a smaller --max-model-len or --num-gpu-blocks) or a trace "
                    "without them (--limit)")
    assert not out.exists()


def test_the_up_front_memory_check_counts_requests_as_the_limits_cut_them(tmp_path, monkeypatch):
    """Under the default limits the same row is cut at max_model_len (num_cut) and a prompt longer than it is
    rejected: neither holds more than a few hundred kilobytes, and the run goes ahead."""
    monkeypatch.setattr(sim.simulator, "host_memory_available", lambda: 8 * 2**30)
    monkeypatch.setattr(cli.sim_replay, "host_memory_available", lambda: 8 * 2**30)
    trace = write_trace(tmp_path / "t.parquet", [100, 100_000_000_000], [10_000_000_000, 2])
    out = tmp_path / "out"
    assert replay_main([str(trace), "--quiet", "--no-report", "--out", str(out)]) in (0, None)
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["num_cut"], summary["num_rejected"]) == (1, 1)
