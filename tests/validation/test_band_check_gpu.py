"""validation/band_check.py --gpu: the committed GPU summaries of an H100 folder are banded with the H100 profile (the
script replayed every run with sim.replay's default, the H200's, so the H100 folders' counts needed a wrapper)."""

from __future__ import annotations

import json

import pytest

from tests.traces.helpers import cli_error
from validation import band_check
from validation.compare_all import HEADLINE


class _Stop(Exception):
    """Raised by the stand-in simulator once it has seen its options."""


def _real_summary(results, run: str) -> None:
    folder = results / run
    folder.mkdir(parents=True)
    summary: dict = {"config": {"num_gpu_blocks": 300}}
    for key in HEADLINE:
        metric, _, stat = key.partition(".")
        if stat:
            summary.setdefault(metric, {})[stat] = 1.0
        else:
            summary[metric] = 1.0
    (folder / "real_summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize(("argv", "gpu"), [([], "h200"), (["--gpu", "h100"], "h100"), (["--gpu", "H100"], "h100")])
def test_the_runs_gpu_reaches_every_replay(tmp_path, monkeypatch, argv, gpu):
    import cli.sim_replay

    seen: list[list[str]] = []

    def simulate(options: list[str]) -> int:
        seen.append(options)
        raise _Stop

    monkeypatch.setattr(cli.sim_replay, "main", simulate)
    _real_summary(tmp_path / "results", "b-azure-p70")
    with pytest.raises(_Stop):
        band_check.main(["--results", str(tmp_path / "results"), "--out", str(tmp_path / "out"), *argv])
    options = seen[0]
    assert options[options.index("--gpu") + 1] == gpu
    assert options[options.index("--num-gpu-blocks") + 1] == "300"


def test_an_unknown_gpu_is_refused_before_any_replay(tmp_path, capsys, monkeypatch):
    import cli.sim_replay

    monkeypatch.setattr(cli.sim_replay, "main", lambda options: pytest.fail("replayed"))
    _real_summary(tmp_path / "results", "b-azure-p70")
    line = cli_error(band_check.main, ["--results", str(tmp_path / "results"), "--gpu", "a100x"], capsys)
    assert line.startswith("error: argument --gpu: invalid choice: 'a100x'")
    assert not (tmp_path / "out").exists()
