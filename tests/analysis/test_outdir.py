"""Two commands given one --out: the folder is one whole run, and the one that finds it written refuses."""

from __future__ import annotations

import pytest

from analysis.outdir import OutDirError, staged_out_dir


def test_a_run_written_meanwhile_is_neither_replaced_nor_mixed(tmp_path):
    """Both passed the check at start; the second to finish silently replaced the first without --overwrite."""
    target = tmp_path / "run"
    with pytest.raises(OutDirError, match=r"was written by another command while this one ran; nothing of this run"):
        with staged_out_dir(target, overwrite=False) as stage:
            (stage / "summary.json").write_text("mine")
            target.mkdir()  # the other command finishes first
            (target / "summary.json").write_text("theirs")
    assert (target / "summary.json").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


def test_a_file_put_there_meanwhile_is_kept(tmp_path):
    target = tmp_path / "run"
    with pytest.raises(OutDirError, match="another command"):
        with staged_out_dir(target, overwrite=False) as stage:
            (stage / "summary.json").write_text("mine")
            target.write_text("a file")
    assert target.read_text() == "a file"


@pytest.mark.parametrize("existing", ["absent", "empty", "earlier run"])
def test_the_usual_cases_still_move_the_run_into_place(tmp_path, existing):
    target = tmp_path / "run"
    if existing != "absent":
        target.mkdir()
    if existing == "earlier run":
        (target / "summary.json").write_text("old")
    with staged_out_dir(target, overwrite=existing == "earlier run") as stage:
        (stage / "summary.json").write_text("new")
    assert (target / "summary.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_name_near_the_file_systems_limit_is_written(tmp_path, overwrite):
    """A 250-character --out is a valid name, but its staging folder '.NAME.partial-PID' was not: the run was refused
    as 'cannot write there (File name too long)'. The staging and replaced folders' names are now shortened."""
    target = tmp_path / ("r" * 250)
    if overwrite:
        target.mkdir()
        (target / "summary.json").write_text("old")
    with staged_out_dir(target, overwrite=overwrite) as stage:
        assert len(stage.name.encode()) <= 255 and stage.name.startswith(".rrr") and ".partial-" in stage.name
        (stage / "summary.json").write_text("new")
    assert (target / "summary.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # nothing left beside it


def test_a_file_near_the_name_limit_is_written_whole(tmp_path):
    from sim.files import write_text_atomic

    path = tmp_path / ("t" * 251 + ".csv")
    write_text_atomic(path, "start_s,slowdown\n0,1\n")
    assert path.read_text() == "start_s,slowdown\n0,1\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_default_folder_of_a_trace_with_a_long_name(tmp_path, monkeypatch):
    """sim.replay of a trace named with 240 characters (a valid name) and no --out: 'runs/sim-NAME-TIMESTAMP' passed
    255 bytes and exists() raised OSError, a traceback. The trace's name is cut to 100 characters in it."""
    from analysis.outdir import default_out_dir

    monkeypatch.chdir(tmp_path)
    out = default_out_dir("sim", "t" * 240)
    assert out.parent.name == "runs" and out.name.startswith("sim-" + "t" * 100 + "-") and len(out.name) < 130
    with staged_out_dir(out, overwrite=False) as stage:
        (stage / "summary.json").write_text("{}")
    assert (out / "summary.json").is_file()


@pytest.mark.parametrize("below", [("run",), ("deeper", "run")])
def test_a_file_above_the_target_is_named(tmp_path, below):
    """mkdir under a file said "cannot write there (File exists)", or "(Not a directory)" one level deeper."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    target = blocker.joinpath(*below)
    with pytest.raises(OutDirError) as error:
        with staged_out_dir(target, overwrite=False):
            pytest.fail("staged under a file")
    assert str(error.value) == f"--out {target}: {blocker} is a file, not a folder"
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def _sim_replay(out, monkeypatch):
    import cli.sim_replay as sim_replay
    from tests.sim.helpers import SHAREGPT

    monkeypatch.setattr(sim_replay, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    return sim_replay.main, [str(SHAREGPT), "--limit", "20", "--quiet", "--out", str(out)]


def _engine_replay(out, monkeypatch):
    import engine.llm
    from cli.engine_replay import main
    from tests.sim.helpers import SHAREGPT

    monkeypatch.setattr(engine.llm, "LLM", lambda *a, **k: pytest.fail("the model loaded before checking --out"))
    return main, [str(SHAREGPT), "--limit", "2", "--model", "qwen3-0.6b", "--load-format", "dummy", "--device", "cpu",
                  "--quiet", "--out", str(out)]


def _compare(out, monkeypatch):
    from analysis.compare.cli import main
    from tests.analysis.test_compare import write_pair

    real_dir, sim_dir = write_pair(out.parents[1])
    return main, [str(real_dir), str(sim_dir), "--out", str(out)]


def _capacity(out, monkeypatch):
    import analysis.capacity.cli as capacity
    from tests.sim.helpers import SHAREGPT

    monkeypatch.setattr(capacity, "run_capacity", lambda *a, **k: pytest.fail("swept before checking --out"))
    return capacity.main, [str(SHAREGPT), "--slo", "ttft_p90=2s", "--quiet", "--out", str(out)]


@pytest.mark.parametrize("command", [_sim_replay, _engine_replay, _compare, _capacity])
def test_every_command_names_a_file_above_its_out(tmp_path, capsys, monkeypatch, command):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    out = blocker / "run"
    main, argv = command(out, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"error: --out {out}: {blocker} is a file, not a folder\n"
