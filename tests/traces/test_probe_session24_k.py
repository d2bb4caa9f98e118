"""Session 24, probe K: traces.synth's think time, whose errors named --warmup-s, an option not given (the default
warm-up derived from the think time overflowed), or which overflowed the arrivals with a numpy warning."""

from __future__ import annotations

import pytest

from tests.traces.helpers import cli_error
from traces.synth import main as synth_main


@pytest.mark.parametrize(("args", "line"), [
    # the default warm-up, 4 x mean turns x think time, draws 4 x think time x qps sessions
    (["--think-time-s", "600000"], "error: --think-time-s 600000 at --qps 1 makes the default warm-up draw 2.4e+06 "
     "sessions before the trace starts; expected --think-time-s at most 500000 s at this --qps (or give --warmup-s) "
     "(--help lists the options)"),
    (["--think-time-s", "1e308"], "error: --think-time-s must be a finite number > 0, at most 1e+12 s, got 1e+308 "
     "(--help lists the options)"),
    # with a warm-up given, a think time of 1e308 overflowed the later turns' arrivals (a RuntimeWarning, exit 0)
    (["--think-time-s", "1e308", "--warmup-s", "0"], "error: --think-time-s must be a finite number > 0, at most "
     "1e+12 s, got 1e+308 (--help lists the options)"),
])
def test_a_think_time_beyond_its_bound_is_named(tmp_path, capsys, args, line):
    out = tmp_path / "s.parquet"
    argv = ["-o", str(out), "--num-requests", "5", "--qps", "1", "--multi-turn", *args]
    assert cli_error(synth_main, argv, capsys) == line
    assert not out.exists()


def test_a_think_time_at_the_default_warm_ups_bound_is_drawn(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    assert synth_main(["-o", str(out), "--num-requests", "5", "--qps", "1", "--multi-turn", "--think-time-s",
                       "500000"]) == 0
    assert out.is_file()
