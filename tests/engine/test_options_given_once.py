"""An option that takes a value is refused when given twice (engine.core.config_args.OneLineErrorParser): argparse
kept the last value, so ``analysis.capacity --slo ttft_p90=1ms --slo tpot_p90=100ms`` judged capacity by the TPOT
limit alone, the TTFT one dropped without a word (a hostile-input probe's finding)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.config_args import OneLineErrorParser

REPO = Path(__file__).resolve().parents[2]


def _parser() -> OneLineErrorParser:
    parser = OneLineErrorParser(prog="tool")
    parser.add_argument("trace")
    parser.add_argument("--qps", type=float)
    parser.add_argument("-o", "--out")
    parser.add_argument("--tag", action="append", default=[])  # meant to repeat
    parser.add_argument("--quiet", action="store_true")
    group = parser.add_argument_group("more")
    group.add_argument("--slo")
    return parser


@pytest.mark.parametrize("argv, line", [
    (["t", "--qps", "1", "--qps=2"], "error: --qps is given twice; give it once (only the last value would count)"),
    (["t", "-o", "a", "--out", "b"],
     "error: -o (--out) is given twice; give it once (only the last value would count)"),
    (["t", "--slo", "ttft_p90=1s", "--slo", "tpot_p90=1s"],
     "error: --slo is given twice; give it once (only the last value would count)"),
])
def test_an_option_given_twice_is_refused(argv, line, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"{line} (--help lists the options)\n"


def test_options_meant_to_repeat_and_separate_parses_still_work() -> None:
    parser = _parser()
    args = parser.parse_args(["t", "--tag", "a", "--tag", "b", "--quiet", "--quiet", "--qps", "3"])
    assert (args.tag, args.quiet, args.qps, args.out) == (["a", "b"], True, 3.0, None)
    assert parser.parse_args(["t", "--qps", "4"]).qps == 4.0  # what one parse saw does not carry to the next


def test_capacity_refuses_a_second_slo_before_it_simulates(tmp_path) -> None:
    out = tmp_path / "capacity"
    proc = subprocess.run([sys.executable, "-m", "analysis.capacity", "traces/sharegpt.parquet", "--slo",
                           "ttft_p90=1ms", "--slo", "tpot_p90=100ms", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("error: --slo is given twice; give it once (only the last value would count) "
                           "(--help lists the options)\n")
    assert not out.exists()
