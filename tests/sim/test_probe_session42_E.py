"""Session 42 (helper E) probes of the benchmarks run on CPU: each case below was a traceback, or an option ignored
(or misnamed) at exit 0 or 2; now one line naming it, exit 2, before any work where the options alone tell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAREGPT = REPO / "traces" / "sharegpt.parquet"


def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_serving_ceiling_rates_pricing_steps_past_any_run_are_one_line_and_write_no_json(tmp_path):
    # --bandwidth-tbs 1e-300 priced each step at ~1e297 s: the summary's time check was a ValueError traceback, exit 1
    out = tmp_path / "ceiling.json"
    done = _script("benchmarks/serving_ceiling.py", "--model", "qwen3-8b", "--gpu", "l40s", "--bandwidth-tbs",
                   "1e-300", "--trace", str(SHAREGPT), "--num-requests", "10", "--json", str(out))
    assert done.returncode == 2
    assert done.stderr == (
        "note: no measured profile of qwen3-8b on l40s: the ceilings alone\n"
        "error: the kernels-in-sequence replays cannot be summarized: requests table: column 'first_scheduled_s' is "
        "3.45642e+298 at row 1; times must be within 2e+12 seconds of the run's start (their steps are priced beyond "
        "any GPU: check --model, --matmul-tflops, --attention-tflops and --bandwidth-tbs)\n")
    assert not out.exists()


def test_sim_speed_refuses_top_without_profile():
    # --top sized a table only --profile prints: ignored at exit 0
    done = _script("benchmarks/sim_speed.py", "--no-pin", "--trace", str(SHAREGPT), "--limit", "5", "--top", "5")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == ("error: --top sets the rows of --profile's tables; pass --profile or leave "
                                            "--top out (--help lists the options)")


def test_sim_instructions_refuses_a_trace_beside_sessions():
    # --sessions replaced --trace unsaid: the figures were of the sessions, at exit 0
    done = _script("benchmarks/sim_instructions.py", "--sessions", "--trace", str(SHAREGPT), "--limit", "5")
    assert done.returncode == 2
    assert done.stderr == f"error: --sessions replaces --trace {SHAREGPT}; give one or the other\n"


def test_capacity_speed_names_the_sweep_options_it_sets_itself(tmp_path):
    # the sweep's own parser said "--out is given twice", of an --out given once (in --sweep)
    for given, why in (("--out", "the timed sweep writes to a temporary folder"),
                       ("--jobs", "give --jobs to this script")):
        sweep = f"{SHAREGPT} --slo ttft_p90=2s {given}={tmp_path / '2'}"
        done = _script("benchmarks/capacity_speed.py", "--sweep", sweep)
        assert done.returncode == 2
        assert done.stderr == f"error: --sweep {sweep!r}: {given} is set here ({why}); leave it out of --sweep\n"
    assert list(tmp_path.iterdir()) == []
