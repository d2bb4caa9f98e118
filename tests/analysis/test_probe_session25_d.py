"""Session 25, probe D: a Ctrl-C (or a failed rename) between --overwrite's two renames left the earlier run hidden
as .OUT.old-PID and no OUT at all."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from analysis.outdir import staged_out_dir


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.EIO, "Input/output error")])
def test_the_earlier_run_is_back_in_place_when_the_new_one_is_not(tmp_path, monkeypatch, failure):
    target = tmp_path / "run"
    target.mkdir()
    (target / "summary.json").write_text("earlier")
    rename = Path.rename

    def rename_but_the_new_run(self, other):
        if self.name.startswith(".run.partial-"):  # the earlier run was moved aside just before
            raise failure
        return rename(self, other)

    monkeypatch.setattr(Path, "rename", rename_but_the_new_run)
    with pytest.raises(type(failure)):
        with staged_out_dir(target, overwrite=True) as stage:
            (stage / "summary.json").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert (target / "summary.json").read_text() == "earlier"


def test_overwrite_replaces_the_earlier_run_whole(tmp_path):
    target = tmp_path / "run"
    target.mkdir()
    (target / "steps.parquet").write_text("earlier")
    with staged_out_dir(target, overwrite=True) as stage:
        (stage / "summary.json").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert sorted(p.name for p in target.iterdir()) == ["summary.json"]
