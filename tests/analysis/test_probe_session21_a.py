"""Hostile-input probe (session 21, A): capacity sweeps that simulate one configuration under two names, and
counts printed with a plural for one."""

from __future__ import annotations

from analysis.capacity.cli import main as capacity_main
from analysis.compare.cli import main as compare_main
from cli.sim_replay import main as replay_main
from tests.sim.helpers import SHAREGPT
from tests.traces.helpers import cli_error


def test_capacity_refuses_routers_with_one_replica(tmp_path, capsys) -> None:
    """--router rr,lor --replicas 1 searched one configuration twice, printed as two (each with its own replicas
    needed): a router only chooses between replicas."""
    out = tmp_path / "out"
    line = cli_error(capacity_main, [str(SHAREGPT), "--slo", "ttft_p90=2s", "--router", "rr,lor", "--replicas", "1",
                                     "--quiet", "--out", str(out)], capsys)
    assert line == ("error: --router rr,lor: a router chooses between replicas, and every configuration has "
                    "--replicas 1, so each router would simulate the same configuration; give one router, or "
                    "--replicas with a count above 1")
    assert not out.exists()


def test_compare_of_one_request_says_one_request(tmp_path, capsys) -> None:
    """'schedules identical: 61 steps, 1 requests' and compare.md's '1 requests matched'."""
    runs = []
    for name in ("a", "b"):
        runs.append(tmp_path / name)
        assert replay_main([str(SHAREGPT), "--limit", "1", "--out", str(runs[-1]), "--quiet", "--no-report"]) == 0
    out = tmp_path / "cmp"
    assert compare_main([*map(str, runs), "--out", str(out), "--no-report", "--schedule"]) == 0
    assert ", 1 request (same placement, tokens, cached tokens, preemptions)\n" in capsys.readouterr().out
    assert "; 1 request matched.\n" in (out / "compare.md").read_text()


def test_capacity_refuses_one_model_named_twice(tmp_path, capsys) -> None:
    """--model qwen3-0.6b,engine/configs/qwen3-0.6b swept one model as two configurations (the same answer twice):
    only the same spelling given twice was refused."""
    from engine.core.model_config import CONFIG_DIR

    path = f"{CONFIG_DIR / 'qwen3-0.6b'}/"
    line = cli_error(capacity_main, [str(SHAREGPT), "--slo", "ttft_p90=2s", "--model", f"qwen3-0.6b,{path}",
                                     "--quiet", "--out", str(tmp_path / "out")], capsys)
    assert line == (f"error: argument --model: qwen3-0.6b and {path} in 'qwen3-0.6b,{path}' are the same "
                    f"({(CONFIG_DIR / 'qwen3-0.6b').resolve()}); give it once (--help lists the options)")
    assert not (tmp_path / "out").exists()
