"""Session 36, helper E: the scripts run as files (validation/, benchmarks/) given a path with a name over the file
system's 255 bytes: an OSError traceback and status 1 at the first Path.exists() or is_file() that met it
(``python validation/step_errors.py LONG``, ``benchmarks/sim_instructions.py --tree LONG``, ``bench_client.py
LONG.parquet``, ``validation/make_traces.py --shared LONG``, ``benchmarks/steady_capacity.py --json LONG.json``,
``benchmarks/serving_overhead.py ... --out-dir LONG``, ``benchmarks/serving.py --trace LONG``, ...); now one line
and status 2."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.interrupt import one_line_script_errors
from sim.files import check_output_path
from tests.traces.helpers import REPO_ROOT
from traces.files import long_name_problem

LONG = "a" * 300
SUFFIX = "File name too long; expected a path whose names are at most 255 bytes each (4096 in all)\n"


def _script(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_one_line_script_errors_turns_the_oserror_into_status_2(capsys) -> None:
    def main() -> int:
        Path(LONG).exists()  # raises OSError(ENAMETOOLONG) on Linux
        return 0

    with pytest.raises(SystemExit) as stopped:
        one_line_script_errors(main)()
    assert stopped.value.code == 2
    assert capsys.readouterr().err == f"error: {LONG}: {SUFFIX}"


def test_one_line_script_errors_leaves_other_errors_and_results_alone() -> None:
    def missing() -> int:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "x")

    with pytest.raises(FileNotFoundError):
        one_line_script_errors(missing)()
    assert one_line_script_errors(lambda: 7)() == 7


def test_an_output_path_with_a_long_name_is_refused_by_its_option(tmp_path: Path) -> None:
    target = tmp_path / f"{LONG}.json"
    expected = (f"--json {target}: a name in it is 305 bytes long; expected a path whose names are at most 255 bytes "
                "each")
    assert long_name_problem(target, "--json") == expected
    assert check_output_path(str(target), "--json", [tmp_path / "input.parquet"]) == expected
    assert long_name_problem(tmp_path / "short.json", "--json") is None
    assert check_output_path(str(tmp_path / "short.json"), "--json", [tmp_path / "input.parquet"]) is None


@pytest.mark.parametrize(("args", "named"), [
    (["validation/step_errors.py", "{long}"], "{long}/steps.parquet"),
    (["validation/loop_gaps.py", "{long}"], "{long}/steps.parquet"),
    (["validation/make_traces.py", "--shared", "{long}"], "{long}/azure_llm_2023_conv.csv"),
    (["benchmarks/sim_instructions.py", "--tree", "{long}"], "{long}/sim/simulator.py"),
    (["benchmarks/bench_client.py", "{long}.parquet"], "{long}.parquet"),
])
def test_a_script_given_a_long_name_says_one_line_and_exits_2(tmp_path: Path, args, named) -> None:
    long = str(tmp_path / LONG)
    done = _script([arg.format(long=long) for arg in args])
    assert done.returncode == 2
    assert done.stderr == f"error: {named.format(long=long)}: {SUFFIX}"


def test_steady_capacity_refuses_a_long_json_name(tmp_path: Path) -> None:
    target = tmp_path / f"{LONG}.json"
    done = _script(["benchmarks/steady_capacity.py", "--json", str(target)])
    assert done.returncode == 2
    assert done.stderr == (f"error: --json {target}: a name in it is 305 bytes long; expected a path whose names are "
                           "at most 255 bytes each\n")


def test_serving_overhead_refuses_a_long_out_dir(tmp_path: Path) -> None:
    trace = REPO_ROOT / "traces" / "sharegpt.parquet"
    out_dir = tmp_path / LONG
    done = _script(["benchmarks/serving_overhead.py", str(trace), "--qps", "1", "--limit", "2", "--out-dir",
                    str(out_dir), "--json", str(tmp_path / "so.json")])
    assert done.returncode == 2
    assert done.stderr == (f"error: --out-dir {out_dir}: a name in it is 300 bytes long; expected a path whose names "
                           "are at most 255 bytes each\n")
    assert not (tmp_path / "so.json").exists()


def test_serving_refuses_a_long_trace_name(tmp_path: Path) -> None:
    trace = tmp_path / f"{LONG}.parquet"
    done = _script(["benchmarks/serving.py", "--trace", str(trace)])
    assert done.returncode == 2
    assert done.stderr == f"error: --trace: {trace} is not a file\n"
