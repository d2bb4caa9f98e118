"""Outputs are written whole or not at all: an existing folder is never clobbered or mixed, a failed or
interrupted write leaves nothing behind, and a bad --out fails before any simulating."""

from __future__ import annotations

import errno
import time

import pytest

import cli.sim_replay as sim_replay
from tests.sim.helpers import SHAREGPT

ARGS = [str(SHAREGPT), "--limit", "20", "--quiet"]


def _run(out, *extra) -> int:
    try:
        return sim_replay.main([*ARGS, "--out", str(out), *extra])
    except SystemExit as exc:
        return exc.code


def test_an_existing_folder_is_refused_unless_overwrite_replaces_it_whole(tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(out) == 0
    assert (out / "report.html").is_file()
    before = (out / "requests.parquet").read_bytes()
    assert _run(out, "--no-report") == 2
    expected = f"error: --out {out} exists and is not empty; pass --overwrite to replace it"
    assert capsys.readouterr().err.strip() == expected
    assert (out / "requests.parquet").read_bytes() == before
    assert _run(out, "--no-report", "--overwrite") == 0
    assert not (out / "report.html").exists()  # the earlier run's report does not survive into this one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no staging folder left


def test_an_unwritable_out_fails_before_simulating(tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(sim_replay, "simulate", lambda *a, **k: pytest.fail("simulated before checking --out"))
    started = time.perf_counter()
    assert _run(tmp_path / "a_file" / "run") == 2
    assert time.perf_counter() - started < 5
    err = capsys.readouterr().err
    # it was "cannot write there (File exists)", naming neither the file nor what is wrong with it
    assert err == f"error: --out {tmp_path / 'a_file' / 'run'}: {tmp_path / 'a_file'} is a file, not a folder\n"


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_write_leaves_nothing(tmp_path, capsys, monkeypatch, failure):
    out = tmp_path / "run"

    def write_then_fail(*args, **kwargs):
        stage = args[1]
        (stage / "requests.parquet").write_bytes(b"half")  # a partial file, as a full disk leaves one
        raise failure

    monkeypatch.setattr(sim_replay, "write_outputs", write_then_fail)
    if isinstance(failure, KeyboardInterrupt):  # Ctrl-C: one line, exit 130, as traces.bench and analysis.capacity
        assert _run(out) == 130
        assert capsys.readouterr().err == f"interrupted: nothing written to {out}\n"
    else:
        assert _run(out) == 2
        assert capsys.readouterr().err.strip() == f"error: --out {out}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_a_failed_overwrite_keeps_the_earlier_run(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert _run(out, "--no-report") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(sim_replay, "write_outputs", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O")))
    assert _run(out, "--overwrite") == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_overwrite_never_replaces_a_folder_that_is_not_a_run(tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    assert _run(home, "--overwrite") == 2
    expected = f"error: --out {home} holds files no run wrote (notes.txt); --overwrite replaces only an earlier run's"
    assert capsys.readouterr().err.startswith(expected)
    assert (home / "notes.txt").read_text() == "precious"


def test_overwrite_never_replaces_a_folder_or_link_under_a_run_files_name(tmp_path, capsys):
    # Only names were compared: a folder called summary.json, with the user's files in it, counted as a run's.
    home = tmp_path / "home"
    (home / "summary.json").mkdir(parents=True)
    (home / "summary.json" / "thesis.txt").write_text("precious")
    assert _run(home, "--overwrite") == 2
    assert capsys.readouterr().err.startswith(f"error: --out {home} holds files no run wrote (summary.json)")
    assert (home / "summary.json" / "thesis.txt").read_text() == "precious"
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "mine.json").write_text("precious")
    (linked / "run.json").symlink_to(tmp_path / "mine.json")
    assert _run(linked, "--overwrite") == 2
    assert (linked / "run.json").is_symlink() and (tmp_path / "mine.json").read_text() == "precious"


def test_an_input_reached_through_a_link_inside_out_is_not_replaced(tmp_path, capsys):
    # The input's resolved path lies elsewhere, but the name the user gave is inside --out: --overwrite deleted it.
    out = tmp_path / "q"
    out.mkdir()
    (out / "requests.parquet").symlink_to(SHAREGPT)
    code = _run_args([str(out / "requests.parquet"), "--limit", "5", "--quiet", "--out", str(out), "--overwrite"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --out {out} is or holds the input {out / 'requests.parquet'}; write the output elsewhere")
    assert (out / "requests.parquet").is_symlink()


def _run_args(args) -> int:
    try:
        return sim_replay.main(args)
    except SystemExit as exc:
        return exc.code


def test_the_current_folder_is_never_an_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(".") == 2
    assert capsys.readouterr().err.strip() == (
        "error: --out . is the current folder or one above it; name a folder for the run")
    assert _run("..", "--overwrite") == 2
    assert list(tmp_path.iterdir()) == []


def test_a_profile_path_that_is_not_utf8_still_gets_a_report(tmp_path, capsys):
    """A profile path with a byte that is not UTF-8 is named in the report's subtitle: writing report.html failed
    with a UnicodeEncodeError traceback after the whole replay had run."""
    import os

    profile = tmp_path / os.fsdecode(b"p\xff.json")
    profile.write_bytes((SHAREGPT.parents[1] / "sim" / "profiles" / "h200" / "qwen3-0.6b.json").read_bytes())
    out = tmp_path / "run"
    assert _run(out, "--cost-model", str(profile)) == 0
    assert "profile:h200/p\\udcff (measured" in (out / "report.html").read_text(encoding="utf-8")
