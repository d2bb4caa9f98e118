"""A usage error of every command-line tool is one line: ``error: ... (--help lists the options)``, exit 2, no
traceback. Plain argparse printed its whole usage block (up to some 30 lines) above the line that said what was
wrong; each tool now builds its parser with ``engine.core.config_args.OneLineErrorParser``.

Each case runs the tool as a user would (``python -m MODULE`` or ``python path/to/script.py`` from the repository
root, in a child process): once with an unknown option (the required arguments given, so that the option is what
is refused) and, where the tool has a numeric option, once with a value that is no valid number for it. The
children start together (their imports are most of their time), so the file takes seconds, not a minute.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60  # a refusal comes after the imports alone; a tool that started its work would run past this
TMP = "{tmp}"  # replaced by a fresh folder: outputs the tools are named but must not write

# id -> (command, required arguments, a numeric option and a bad value for it, or None). A module is run with -m.
CLIS: dict[str, tuple[list[str], list[str], tuple[str, str] | None]] = {
    "analysis.capacity": (["-m", "analysis.capacity"], ["trace.parquet", "--slo", "ttft_p90=2s"], ("--qps-min", "nan")),
    "analysis.compare": (["-m", "analysis.compare"], ["real", "sim"], None),
    "analysis.summarize": (["-m", "analysis.summarize"], ["run"], None),
    "analysis.vllm_import": (["-m", "analysis.vllm_import"], ["result.json", "--out", f"{TMP}/run"], ("--limit", "x")),
    "sim.calibrate": (["-m", "sim.calibrate"], ["profile.json", "run"], None),
    "sim.fit_profile": (["-m", "sim.fit_profile"], ["profile.json"], None),
    "sim.host_speed": (["-m", "sim.host_speed"], ["run", "--profile", "profile.json", "--out", f"{TMP}/out.csv"],
                       ("--window-s", "x")),
    "sim.profile": (["-m", "sim.profile"], ["--out", f"{TMP}/profile.json"], ("--decode-steps", "x")),
    "traces.convert": (["-m", "traces.convert"], ["azure", "trace.csv", "-o", f"{TMP}/out.parquet"], ("--qps", "nan")),
    "traces.info": (["-m", "traces.info"], ["trace.parquet"], None),
    "traces.synth": (["-m", "traces.synth"], ["-o", f"{TMP}/out.parquet", "--num-requests", "3", "--qps", "1"],
                     ("--seed", "x")),
    "traces.bench": (["-m", "traces.bench"], ["http://127.0.0.1:9", "trace.parquet"], ("--request-timeout-s", "nan")),
    "benchmarks/bench_client.py": (["benchmarks/bench_client.py"], ["trace.parquet"], ("--qps", "nan")),
    "benchmarks/capacity_speed.py": (["benchmarks/capacity_speed.py"], [], ("--jobs", "x")),
    "benchmarks/cudnn_prefill.py": (["benchmarks/cudnn_prefill.py"], [], None),
    "benchmarks/decode_real_batches.py": (["benchmarks/decode_real_batches.py"], [f"{TMP}/out.json"], None),
    "benchmarks/decode_splits.py": (["benchmarks/decode_splits.py"], [], ("--max-model-len", "x")),
    "benchmarks/kernels.py": (["benchmarks/kernels.py"], [], ("--triton-configs", "x")),
    "benchmarks/server_loop.py": (["benchmarks/server_loop.py"], [], ("--requests", "x")),
    "benchmarks/serving.py": (["benchmarks/serving.py"], [], ("--ttft-p90-ms", "nan")),
    "benchmarks/serving_overhead.py": (["benchmarks/serving_overhead.py"], [
        "trace.parquet", "--qps", "1", "--limit", "1", "--out-dir", f"{TMP}/runs", "--json", f"{TMP}/out.json"],
        ("--limit", "x")),
    "benchmarks/sim_bytecodes.py": (["benchmarks/sim_bytecodes.py"], [], ("--qps", "nan")),
    "benchmarks/sim_instructions.py": (["benchmarks/sim_instructions.py"], [], ("--qps", "nan")),
    "benchmarks/sim_million.py": (["benchmarks/sim_million.py"], [], ("--requests", "x")),
    "benchmarks/sim_speed.py": (["benchmarks/sim_speed.py"], [], ("--qps", "nan")),
    "benchmarks/steady_capacity.py": (["benchmarks/steady_capacity.py"], [], ("--reference-span", "nan")),
    "benchmarks/step.py": (["benchmarks/step.py"], [], ("--repeats", "x")),
    "benchmarks/throughput.py": (["benchmarks/throughput.py"], [], ("--num-seqs", "x")),
    "validation/band_check.py": (["validation/band_check.py"], [], None),
    "validation/compare_all.py": (["validation/compare_all.py"], [], None),
    "validation/decode_fits.py": (["validation/decode_fits.py"], ["run", "--calibration", "run"], None),
    "validation/error_stats.py": (["validation/error_stats.py"], ["label=results"], None),
    "validation/fidelity_summary.py": (["validation/fidelity_summary.py"], ["bands.json"], None),
    "validation/host_episodes.py": (["validation/host_episodes.py"], ["diag"], ("--window-s", "x")),
    "validation/kv_sensitivity.py": (["validation/kv_sensitivity.py"], [], None),
    "validation/loop_gaps.py": (["validation/loop_gaps.py"], ["run"], None),
    "validation/make_traces.py": (["validation/make_traces.py"], [], ("--azure-count", "x")),
    "validation/profile_diff.py": (["validation/profile_diff.py"], ["a.json", "b.json"], None),
    "validation/step_errors.py": (["validation/step_errors.py"], ["run"], ("--batch-bin", "x")),
    # Run as its plan runs it (validation/tp_nccl/tp_hang_plan.sh: PYTHONPATH=$PWD); it imports torch up front.
    "validation/tp_nccl/tp_hang_probe.py": (["validation/tp_nccl/tp_hang_probe.py"], [], ("--idle", "x")),
    "validation/tp_nccl/nccl_graph_check.py": (["validation/tp_nccl/nccl_graph_check.py"], [], None),
}
SLOW_FIRST = {f"validation/tp_nccl/tp_hang_probe.py {suffix}" for suffix in ("--no-such-option", "--idle x")} | {
    f"analysis.capacity {suffix}" for suffix in ("--no-such-option", "--qps-min nan")}
PROBE_MARK = "[probe "  # tp_hang_probe's own phase lines on stderr (a diagnostic: it stamps every phase)

# (case id, argv, a fragment the error line must hold)
CASES: list[tuple[str, list[str], str]] = []
for _name, (_command, _required, _numeric) in CLIS.items():
    CASES.append((f"{_name} --no-such-option", [*_command, *_required, "--no-such-option"], "--no-such-option"))
    if _numeric is not None:
        CASES.append((f"{_name} {' '.join(_numeric)}", [*_command, *_required, *_numeric], _numeric[0]))


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess:
    argv = [arg.replace(TMP, str(tmp)) for arg in argv]
    env = {**os.environ, "PROBE_STACK_DIR": str(tmp / "probe-stacks")}
    if argv[0].startswith("validation/tp_nccl/"):
        env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the tool and anything it started
        out, err = proc.communicate()
        err += f"\n(still running after {TIMEOUT_S} s: the input was not refused up front)"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every selected case's run, the children started together (a few at a time per core)."""
    # Items of this module parametrized by "case" (test_an_empty_path_is_named_as_empty has none).
    selected = {item.callspec.params["case"][0] for item in request.session.items
                if item.module is sys.modules[__name__] and hasattr(item, "callspec")
                and "case" in item.callspec.params}
    # The slowest (torch, then the simulator's and polars' imports) first, so that none is left to run alone at the end.
    cases = sorted((case for case in CASES if case[0] in selected), key=lambda case: case[0] not in SLOW_FIRST)
    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 1) + 2) as pool:
        futures = {name: pool.submit(_run, argv, tmp_path_factory.mktemp("cli")) for name, argv, _ in cases}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_usage_error_is_one_line(case: tuple[str, list[str], str], results) -> None:
    name, argv, option = case
    proc = results[name]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, f"exit status {proc.returncode}, stderr:\n{proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if not line.startswith(PROBE_MARK)]
    assert len(lines) == 1 and lines[0].startswith("error:"), f"expected one error line, got:\n{proc.stderr}"
    assert option in lines[0] and "given twice" not in lines[0], lines[0]
    if option == "--no-such-option":  # refused by the parser itself, not by a check of the tool's own
        assert lines[0].endswith("(--help lists the options)"), lines[0]
    assert proc.stdout == "", proc.stdout


EMPTY_PATH_CASES = [  # (module whose main parses, argv with an empty path, the argument the error names)
    ("cli.sim_replay", ["", "--out", f"{TMP}/run"], "argument trace: is empty"),
    ("analysis.capacity.cli", ["", "--slo", "ttft_p90=2s", "--out", f"{TMP}/run"], "argument trace: is empty"),
    ("analysis.compare.cli", ["", "sim", "--out", f"{TMP}/run"], "argument REAL_DIR: is empty"),
    ("analysis.vllm_import", ["", "--out", f"{TMP}/run"], "argument RESULT.json: is empty"),
    ("analysis.vllm_import", ["result.json", "--trace", "", "--out", f"{TMP}/run"], "argument --trace: is empty"),
    ("sim.calibrate", ["profile.json", "run", ""], "argument runs: is empty"),
    ("sim.fit_profile", [""], "argument profiles: is empty"),
    ("traces.convert", ["azure", "", "-o", f"{TMP}/out.parquet"], "argument SRC: is empty"),
    ("traces.convert", ["azure", "trace.csv", "-o", ""], "argument -o/--output: is empty"),
    ("traces.synth", ["-o", "", "--num-requests", "3", "--qps", "1"], "argument -o/--output: is empty"),
    ("traces.info", ["trace.parquet", ""], "argument PATH: is empty"),
]


@pytest.mark.parametrize(("module", "argv", "message"), EMPTY_PATH_CASES,
                         ids=[f"{module} {message}" for module, _, message in EMPTY_PATH_CASES])
def test_an_empty_path_is_named_as_empty(module, argv, message, tmp_path, capsys) -> None:
    """An empty path (an unset shell variable) is Path(""), the current folder: it was refused as '.: is a
    directory' (a path nobody typed), as 'requests.parquet: no such file', or as '-o : is a directory'."""
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exited:
        main([arg.replace(TMP, str(tmp_path)) for arg in argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
