"""The command lines, run as a user would (`python -m ...` in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.traces.helpers import REPO_ROOT
from traces import load_trace


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("module", ["traces.convert", "traces.synth", "traces.info"])
def test_help(module: str) -> None:
    result = _run(module, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: python -m " + module in result.stdout


def test_http_bench_help_is_the_bench_commands() -> None:
    """`python -m traces.http_bench --help` printed nothing and exited 0: the module had no __main__ block."""
    result = _run("traces.http_bench", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m traces.bench") and "URL" in result.stdout


def test_convert_help_lists_every_format() -> None:
    out = _run("traces.convert", "--help").stdout
    for name in ("azure", "mooncake", "burstgpt", "sharegpt", "vidur"):
        assert f"\n  {name} " in out


def test_convert_cli(tmp_path: Path) -> None:
    source = tmp_path / "azure.csv"
    source.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.2224670,879,0\n"
    )
    out = tmp_path / "out.parquet"
    result = _run("traces.convert", "azure", str(source), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"wrote 2 requests to {out}: span 4.315 s (0.232 req/s), mean prompt 385.0 tokens, "
        "mean output 76.5 tokens, dropped 1 request with 0 prompt or 0 output tokens"
    )
    assert load_trace(out).requests["prompt_tokens"].to_list() == [374, 396]


def test_convert_cli_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    source = tmp_path / "bad.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,x,1\n")
    result = _run("traces.convert", "azure", str(source), "-o", str(tmp_path / "o.parquet"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {source}: line 2: field 'ContextTokens' is 'x'; expected an integer"
    assert not (tmp_path / "o.parquet").exists()


def test_synth_cli(tmp_path: Path) -> None:
    out = tmp_path / "synth.parquet"
    args = ["traces.synth", "-o", str(out), "--num-requests", "200", "--qps", "4", "--arrival", "gamma", "--cv", "2",
            "--prompt-dist", "uniform:low=10,high=20", "--output-dist", "fixed:5", "--multi-turn", "--turns", "fixed:2",
            "--seed", "9"]
    result = _run(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote 200 requests to {out}: span ")
    trace = load_trace(out)
    assert len(trace) == 200 and trace.hash_block_size == 16
    first = out.read_bytes()
    assert _run(*args).returncode == 2  # an existing -o is replaced only with --overwrite
    assert _run(*args, "--overwrite").returncode == 0
    assert out.read_bytes() == first  # deterministic with --seed


def test_synth_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    result = _run("traces.synth", "-o", str(tmp_path / "x.parquet"), "--num-requests", "5", "--qps", "1",
                  "--prompt-dist", "lognormal:sigma=1")
    assert result.returncode == 2
    assert "give exactly one of mean= or median=" in result.stderr
    result = _run("traces.synth", "-o", str(tmp_path / "x.parquet"), "--num-requests", "5", "--qps", "1",
                  "--arrival", "gamma")
    assert result.returncode == 2 and "--arrival gamma needs --cv" in result.stderr


def test_convert_never_writes_over_its_source(tmp_path: Path) -> None:
    source = tmp_path / "a.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,1\n")
    before = source.read_bytes()
    result = _run("traces.convert", "azure", str(source), "-o", str(tmp_path / "." / "a.csv"))
    assert result.returncode == 2
    expected = f"error: -o {tmp_path / '.' / 'a.csv'} is the source trace; write the parquet elsewhere"
    assert result.stderr.strip() == expected
    assert source.read_bytes() == before


def test_info_cli(tmp_path: Path) -> None:
    result = _run("traces.info", str(REPO_ROOT / "traces" / "sharegpt.parquet"), str(tmp_path / "missing.parquet"))
    assert result.returncode == 2  # the project's exit status for bad input
    assert "sharegpt.parquet: 2000 requests over" in result.stdout
    assert "missing.parquet: cannot read the trace: no such file" in result.stderr


def test_a_slow_rate_is_not_printed_as_zero() -> None:
    """Two requests an hour apart printed '(0.000 req/s)', a rate of nothing; small rates keep 3 significant digits."""
    import polars as pl

    from traces.schema import Trace
    from traces.summary import describe

    def line(arrivals: list[float]) -> str:
        n = len(arrivals)
        frame = pl.DataFrame({"request_id": list(range(n)), "arrival_s": arrivals, "prompt_tokens": [5] * n,
                              "output_tokens": [7] * n})
        return describe(Trace.from_frame(frame, "t"), "out.parquet")

    assert "span 3600.000 s (0.000278 req/s)" in line([0.0, 3600.0])
    assert "span 4.000 s (0.500 req/s)" in line([0.0, 2.0, 4.0])
    assert "span 0.000 s (all at once)" in line([1.0, 1.0])
    # --qps 1e308 printed '(7226771381565559584407661821646814851623050609755238100041658627995362...' (308 digits)
    assert "span 1e-300 s (1e+300 req/s)" in line([0.0, 1e-300])
    assert "span 0.0002 s (10000.000 req/s)" in line([0.0, 0.0001, 0.0002])
    assert "span 4.94e-324 s (a rate beyond 1e308 req/s)" in line([0.0, 5e-324])  # was '(inf req/s)'
