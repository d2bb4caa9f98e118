"""validation/band_check.py checks a configuration's GPU repeats against its band, as compare_all names them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from validation.band_check import _gpu_runs  # noqa: E402


def test_a_runs_repeats_are_found_and_the_comparisons_between_them_are_not(tmp_path):
    for name in ("b-azure-p70", "b-azure-p70-b", "b-azure-p70-2", "b-azure-p70-b-vs-b-azure-p70", "b-azure-p95",
                 "e-prefill-p70-b"):
        (tmp_path / name).mkdir()
        if name != "b-azure-p70-2":  # a folder without a GPU summary is no run
            (tmp_path / name / "real_summary.json").write_text("{}")
    assert _gpu_runs(tmp_path, "b-azure-p70") == ["b-azure-p70", "b-azure-p70-b"]
    assert _gpu_runs(tmp_path, "b-azure-p95") == ["b-azure-p95"]
    assert _gpu_runs(tmp_path, "e-prefill-p70") == ["e-prefill-p70-b"]  # a repeat whose first run is not here
    assert _gpu_runs(tmp_path, "c-mooncake") == []


def test_fidelity_summary_groups_runs_by_load_and_figure(tmp_path, capsys):
    import json

    from validation.fidelity_summary import load_class, main

    assert [load_class(c) for c in ("b-azure-light", "e-prefill-p70", "c-mooncake", "b-azure-p95", "d-azure-kv",
                                    "a-bench-nano")] == ["light", "~70 %", "~70 %", "~95 %", "KV pressure", "offline"]

    def row(config, run, gpu, sim, inside):
        return {"config": config, "run": run, "figure": "ttft_ms.p50", "gpu": gpu, "sim": sim, "p5": 0, "median": 0,
                "p95": 0, "inside": inside}

    rows = [row("b-azure-light", "b-azure-light", 100.0, 102.0, True),
            row("b-azure-light", "b-azure-light-b", 90.0, 102.0, False),  # +13.3 %
            row("e-prefill-light", "e-prefill-light", 50.0, 48.0, True),  # -4 %
            row("b-azure-p95", "b-azure-p95", 10.0, 9.0, True)]
    path = tmp_path / "bands.json"
    path.write_text(json.dumps({"bands": "20", "results": "x", "rows": rows}))
    out = tmp_path / "fidelity.md"
    assert main([str(path), "--out", str(out)]) == 0
    written = json.loads(out.with_suffix(".json").read_text())
    summary = written["by_load"]
    # per trace shape and load: Azure light's two runs (+2 %, +13.3 %), prefill-heavy light, Azure ~95 %
    assert [(s["shape"], s["load"], s["num_figures"], s["within_3pct"], s["within_10pct"])
            for s in written["by_shape"]] == [("conversation (Azure)", "light", 2, 1, 1),
                                              ("conversation (Azure)", "~95 %", 1, 0, 1),
                                              ("prefill-heavy", "light", 1, 0, 1)]
    assert "| conversation (Azure) | light | 2 | +7.7% | +13.3% | 1 of 2 | 1 of 2 |" in out.read_text()
    assert [(s["load"], s["num_runs"], s["within_3pct"], s["within_10pct"], s["inside_band"]) for s in summary] == [
        ("light", 3, 1, 2, 2), ("~95 %", 1, 0, 1, 1)]
    light = summary[0]
    assert light["median_error"] == 0.02 and round(light["largest_error"], 4) == 0.1333
    assert "| light | ttft_ms.p50 | 3 | +2.0% | +13.3% | 1 of 3 | 2 of 3 | 2 of 3 |" in out.read_text()


def test_fidelity_summary_refuses_a_file_that_is_not_a_bands_json(tmp_path, capsys):
    import pytest

    from validation.fidelity_summary import main

    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exc:
        main([str(bad)])
    assert exc.value.code == 2 and "not a bands.json" in capsys.readouterr().err


def test_decode_fits_recover_a_runs_decode_factor(tmp_path, capsys):
    import polars as pl

    from tests.sim.test_calibrate import _fake_run
    from validation.decode_fits import main

    run = _fake_run(tmp_path / "cal", host=1.0, decode=1.1)
    pl.DataFrame({"arrival_s": [0.0, 0.5]}).write_parquet(run / "requests.parquet")
    assert main([str(run), "--calibration", str(run)]) == 0
    out = capsys.readouterr().out
    assert "k 1.1000" in out and "slope 0.000 %" in out  # every decode step is 1.1 x the grid, whatever its batch
    assert out.count("  k        all 1.000") == 2  # the run priced with it, as calibration and as validation


def test_host_timelines_read_each_run_against_its_own_models_profile(tmp_path):
    from validation.compare_all import timeline_profile

    # compare_all --host-timelines read the qwen3-8b runs against qwen3-0.6b's profile: slowdowns of 3-5x
    assert timeline_profile({"model": "qwen3-8b", "tensor_parallel_size": 1}).name == "qwen3-8b.json"
    assert timeline_profile({"model": "qwen3-0.6b"}).name == "qwen3-0.6b.json"
    assert timeline_profile({"model": "qwen3-8b", "tensor_parallel_size": 2}) is None  # no TP=2 profile
    assert timeline_profile({"model": "qwen3-8b"}, str(tmp_path / "p.json")) == tmp_path / "p.json"
