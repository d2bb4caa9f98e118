"""The committed default trace, traces/sharegpt.parquet, and the README command that rebuilds it."""

from __future__ import annotations

import shlex
from pathlib import Path

import polars as pl
import pytest

from tests.traces.helpers import REPO_ROOT
from traces import load_trace
from traces.synth import main as synth_main

DEFAULT_TRACE = REPO_ROOT / "traces" / "sharegpt.parquet"
README = REPO_ROOT / "traces" / "README.md"


def _rebuild_command() -> list[str]:
    """The `python -m traces.synth ... -o traces/sharegpt.parquet ...` line of traces/README.md."""
    lines = [line.strip() for line in README.read_text().splitlines()]
    commands = [line for line in lines
                if line.startswith("python -m traces.synth") and "traces/sharegpt.parquet" in line]
    assert len(commands) == 1, "traces/README.md must show exactly one command that rebuilds sharegpt.parquet"
    return shlex.split(commands[0])[3:]  # drop "python -m traces.synth"


def test_default_trace_is_small_and_valid() -> None:
    assert DEFAULT_TRACE.stat().st_size < 1_000_000
    trace = load_trace(DEFAULT_TRACE)
    requests = trace.requests
    assert len(trace) == 2000
    assert trace.hash_block_size == 16
    assert {"hash_ids", "session_id", "turn"} <= set(requests.columns)
    assert requests["arrival_s"][0] == 0.0
    assert (len(trace) - 1) / requests["arrival_s"][-1] == pytest.approx(6.0, rel=0.05)
    first_turns = requests.filter(pl.col("turn") == 0)
    assert first_turns["prompt_tokens"].mean() == pytest.approx(161, rel=0.15)
    assert requests["output_tokens"].mean() == pytest.approx(338, rel=0.1)


def test_readme_command_rebuilds_the_default_trace_bit_for_bit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = _rebuild_command()
    out = tmp_path / "sharegpt.parquet"
    argv[argv.index("traces/sharegpt.parquet")] = str(out)
    assert synth_main(argv) == 0
    assert out.read_bytes() == DEFAULT_TRACE.read_bytes()
