"""Hostile-input probe (session 21, C): analysis CLIs; each test failed before its fix."""

from __future__ import annotations

import json

from analysis.capacity.cli import main as capacity_main
from analysis.compare.cli import main as compare_main
from cli.sim_replay import main as replay_main
from sim.fit_profile import main as fit_profile_main
from tests.sim.helpers import REPO, SHAREGPT
from tests.traces.helpers import cli_error

# Two simulations of short streams: enough to find an answer, cheap enough for a unit test.
_SHORT = [str(SHAREGPT), "--slo", "ttft_p90=2s", "--min-duration-s", "0", "--max-iterations", "2", "--qps-max", "8",
          "--no-duration-check", "--jobs", "1"]


def test_capacity_says_when_an_answer_rests_on_a_handful_of_measured_requests(tmp_path, capsys) -> None:
    """--warmup-fraction 0.99 on a 100-request stream judged each QPS on one to three requests, and the stability
    check ignores shortfalls under 10 requests: the answer was printed and written as any other, with no word."""
    out = tmp_path / "out"
    assert capacity_main([*_SHORT, "--min-requests", "100", "--warmup-fraction", "0.99", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    (record,) = json.loads((out / "capacity.json").read_text())
    answer = next(p for p in record["searches"][0]["points"] if p["qps"] == record["max_qps"])
    assert answer["num_requests"] < 10
    (note,) = [n for n in record["notes"] if "measured request" in n]
    assert note.startswith(f"{record['max_qps']:.4g} req/s was judged on only {answer['num_requests']} measured "
                           f"request")
    assert note.endswith("raise --min-requests or --min-duration-s, or lower --warmup-fraction")
    assert f"  {record['label']}: {note}" in printed.splitlines()


def test_capacity_answers_measured_on_enough_requests_get_no_such_note(tmp_path) -> None:
    out = tmp_path / "out"
    assert capacity_main([*_SHORT, "--min-requests", "200", "--quiet", "--out", str(out)]) == 0
    (record,) = json.loads((out / "capacity.json").read_text())
    answer = next(p for p in record["searches"][0]["points"] if p["qps"] == record["max_qps"])
    assert answer["num_requests"] >= 100
    assert not [n for n in record["notes"] if "measured request" in n]


def test_sim_replay_prints_an_out_path_with_a_newline_on_one_line(tmp_path, capsys) -> None:
    """'outputs in DIR/' was printed over two lines for --out 'a<newline>b', and so was the refusal of that folder
    when it was not empty."""
    out = tmp_path / "a\nb"
    assert replay_main([str(SHAREGPT), "--limit", "2", "--no-report", "--out", str(out)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(f"; outputs in {str(tmp_path)}/a\\nb/")
    assert (out / "summary.json").is_file()
    error = cli_error(replay_main, [str(SHAREGPT), "--limit", "2", "--no-report", "--quiet", "--out", str(out)],
                      capsys)
    assert error == f"error: --out {str(tmp_path)}/a\\nb exists and is not empty; pass --overwrite to replace it"


def test_compare_refuses_an_out_folder_inside_an_input_run(tmp_path, capsys) -> None:
    """--out A/cmp wrote the comparison into run A: an input folder that then held a folder no run wrote."""
    runs = []
    for name in ("a", "b"):
        runs.append(tmp_path / name)
        assert replay_main([str(SHAREGPT), "--limit", "2", "--out", str(runs[-1]), "--quiet", "--no-report"]) == 0
    before = sorted(p.name for p in runs[0].iterdir())
    for out in (runs[0] / "cmp", runs[1] / "x" / "y"):
        run = next(r for r in runs if r in out.parents)
        error = cli_error(compare_main, [*map(str, runs), "--out", str(out), "--no-report"], capsys)
        assert error == f"error: --out {out} is inside the input folder {run.resolve()}; write the output elsewhere"
    assert sorted(p.name for p in runs[0].iterdir()) == before
    assert not (runs[1] / "x").exists()
    assert compare_main([*map(str, runs), "--out", str(tmp_path / "cmp"), "--no-report"]) == 0


def test_fit_profile_refuses_a_profile_given_twice(tmp_path, monkeypatch, capsys) -> None:
    """sim.fit_profile P ./P refitted and rewrote one profile twice, printed as two."""
    profile = tmp_path / "p.json"
    profile.write_bytes((REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json").read_bytes())
    before = profile.read_bytes()
    monkeypatch.chdir(tmp_path)
    error = cli_error(fit_profile_main, ["p.json", "./p.json"], capsys)
    assert error == "error: profile ./p.json is given twice (also as p.json); give each profile once"
    assert profile.read_bytes() == before


def test_capacity_searches_configurations_that_differ_only_by_router_with_one_replica_once() -> None:
    """--replicas 1,2 --router rr,lor searched the one-replica configuration once per router: the same simulations
    twice (a router has nothing to choose with one replica). Each configuration still reports its own result,
    exactly what its own search finds."""
    from analysis.capacity.bisection import SearchParams
    from analysis.capacity.executors import SerialExecutor
    from analysis.capacity.sweep import expand_configs, run_sweep
    from analysis.capacity.workload import SessionLibrary, WorkloadParams
    from analysis.slo import parse_slos
    from sim.config import SimConfig
    from traces.schema import load_trace

    library = SessionLibrary.from_trace(load_trace(SHAREGPT).head(120))
    workload, slos = WorkloadParams(min_duration_s=20.0, min_requests=150), parse_slos("ttft_p90=500ms")
    params = SearchParams(start_qps=6.0, tolerance=0.2, max_iterations=4)
    base = SimConfig(model="qwen3-8b", gpu="l40s", cost_model="roofline")
    configs = expand_configs(base, {"num_replicas": [1, 2], "router": ["lor", "rr"]})
    submitted = []

    class Recording(SerialExecutor):
        def submit(self, job):
            submitted.append(job)
            return super().submit(job)

    results = run_sweep(configs, params, Recording(library, workload, slos), seeds=(0, 1))
    searched = [(job.config.num_replicas, job.config.router) for job in submitted]
    assert {(1, "lor"), (2, "lor"), (2, "rr")} == set(searched)  # x1 rr is searched as x1 lor, the first
    assert [r.same_search_as for r in results] == [None, 0, None, None]
    assert results[1].searches == results[0].searches and results[1].label == "x1 router rr"
    assert results[1].num_simulations == results[0].num_simulations and results[1].num_simulations_run == 0
    assert len(submitted) == sum(r.num_simulations_run for r in results)
    # what x1 rr's own search finds
    (alone,) = run_sweep(configs[1:2], params, SerialExecutor(library, workload, slos), seeds=(0, 1))
    assert alone.searches == results[1].searches
