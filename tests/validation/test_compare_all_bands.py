"""validation/compare_all.py --bands N: each run is simulated with N seeded replays too, and the table counts the GPU
run's headline figures inside the simulation's p5-p95 band (a real-vs-real row has none)."""

from __future__ import annotations

import json

import pytest

from sim.bands import MAX_REPLAYS
from tests.traces.helpers import cli_error
from validation import compare_all


def _gpu_run(root, name: str) -> None:
    run = root / name
    run.mkdir(parents=True)
    (run / "requests.parquet").write_bytes(b"the GPU run")
    (run / "summary.json").write_text(json.dumps({"config": {"num_gpu_blocks": 300}}))


@pytest.mark.parametrize("bands", ["1", "-2", "0", "two", "100000000"])
def test_a_band_of_fewer_than_two_replays_is_refused_before_any_work(tmp_path, capsys, monkeypatch, bands):
    import cli.sim_replay

    calls = []
    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: calls.append(argv))
    _gpu_run(tmp_path / "real", "b-azure-p70")
    argv = ["--real", str(tmp_path / "real"), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "r"),
            "--bands", bands]
    assert cli_error(compare_all.main, argv, capsys) == (f"error: --bands must be an integer from 2 to {MAX_REPLAYS} "
                                                         f"(the number of seeded replays; a band needs at least two), "
                                                         f"got {bands!r}")
    assert calls == [] and not (tmp_path / "r").exists()


def test_bands_are_asked_of_the_simulator_and_counted_per_run(tmp_path, capsys, monkeypatch):
    import cli.sim_replay

    calls = []

    def fake_replay(argv):
        calls.append(argv)
        out = argv[argv.index("--out") + 1]
        (tmp_path / "sim").mkdir(exist_ok=True)
        (compare_all.Path(out)).mkdir()
        (compare_all.Path(out) / "summary.json").write_text("{}")

    def fake_compare(compare_main, real, other, out):
        out.mkdir(parents=True, exist_ok=True)
        if other.parent.name == "sim":  # against the simulation: 5 of the 6 latencies inside the band
            metrics = {key: {"rel_error": 0.01, "in_band": key != "e2e_ms.p90"} for key in compare_all.HEADLINE[:6]}
            metrics["output_throughput"] = {"rel_error": 0.0}  # no band: not counted
        else:  # a repeat against the first GPU run
            metrics = {key: {"rel_error": 0.02} for key in compare_all.HEADLINE}
        return metrics, False

    monkeypatch.setattr(cli.sim_replay, "main", fake_replay)
    monkeypatch.setattr(compare_all, "_compare", fake_compare)
    real = tmp_path / "real"
    _gpu_run(real, "b-azure-p70")
    _gpu_run(real, "b-azure-p70-b")
    assert compare_all.main(["--real", str(real), "--sim-out", str(tmp_path / "sim"), "--results",
                             str(tmp_path / "r"), "--bands", "5"]) == 0
    assert len(calls) == 2 and all(argv[argv.index("--bands") + 1] == "5" for argv in calls)
    table = (tmp_path / "r" / "errors.md").read_text()
    assert "| same schedule | real in p5-p95 band |" in table
    errors_table = table.split("Against the target")[0]
    rows = [line for line in errors_table.splitlines() if line.startswith("| (b) Azure conv, ~70%")]
    assert [row.rsplit("|", 2)[-2].strip() for row in rows] == ["5 of 6", "5 of 6", "n/a"]


def test_a_replay_that_fails_leaves_the_runs_earlier_simulation(tmp_path, monkeypatch):
    """The simulation folder was removed before sim.replay ran: a replay that then failed (a trace missing, a bad
    option) lost it. sim.replay --overwrite replaces it only once the new run is whole."""
    import cli.sim_replay

    calls = []

    def failing_replay(argv):
        calls.append(argv)
        raise SystemExit(2)

    monkeypatch.setattr(cli.sim_replay, "main", failing_replay)
    _gpu_run(tmp_path / "real", "b-azure-p70")
    earlier = tmp_path / "sim" / "b-azure-p70"
    earlier.mkdir(parents=True)
    (earlier / "summary.json").write_text('{"earlier": true}')
    with pytest.raises(SystemExit):
        compare_all.main(["--real", str(tmp_path / "real"), "--sim-out", str(tmp_path / "sim"), "--results",
                          str(tmp_path / "r")])
    assert "--overwrite" in calls[0] and (earlier / "summary.json").read_text() == '{"earlier": true}'


@pytest.mark.parametrize("gpu", [None, "h100"])
def test_the_runs_gpu_is_passed_to_the_simulator_and_to_the_host_timelines_profile(tmp_path, monkeypatch, gpu):
    """--gpu (default h200): the GPU the runs were made on; H100 runs were replayed as H200 ones (another profile,
    another memory), and their host timelines read against the H200 profile."""
    import cli.sim_replay

    calls = []

    def fake_replay(argv):
        calls.append(argv)
        (compare_all.Path(argv[argv.index("--out") + 1])).mkdir(parents=True)
        (compare_all.Path(argv[argv.index("--out") + 1]) / "summary.json").write_text("{}")

    monkeypatch.setattr(cli.sim_replay, "main", fake_replay)
    def fake_compare(compare_main, real, other, out):
        out.mkdir(parents=True, exist_ok=True)
        return {key: {"rel_error": 0.01} for key in compare_all.HEADLINE}, None

    monkeypatch.setattr(compare_all, "_compare", fake_compare)
    real = tmp_path / "real"
    _gpu_run(real, "b-azure-p70")
    argv = ["--real", str(real), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "r")]
    assert compare_all.main(argv + (["--gpu", gpu] if gpu else [])) == 0
    [replay] = calls
    assert replay[replay.index("--gpu") + 1] == (gpu or "h200")
    shipped = compare_all.timeline_profile({"model": "qwen3-0.6b"}, "auto", gpu or "h200")
    assert shipped.parts[-2:] == (gpu or "h200", "qwen3-0.6b.json")


def test_an_unknown_gpu_is_refused_before_any_run_is_replayed(tmp_path, capsys, monkeypatch):
    import cli.sim_replay

    calls = []
    monkeypatch.setattr(cli.sim_replay, "main", lambda argv: calls.append(argv))
    _gpu_run(tmp_path / "real", "b-azure-p70")
    argv = ["--real", str(tmp_path / "real"), "--sim-out", str(tmp_path / "sim"), "--results", str(tmp_path / "r"),
            "--gpu", "h999"]
    assert cli_error(compare_all.main, argv, capsys).startswith("error: argument --gpu: invalid choice: 'h999'")
    assert calls == [] and not (tmp_path / "r").exists()
