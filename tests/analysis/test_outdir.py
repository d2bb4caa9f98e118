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
