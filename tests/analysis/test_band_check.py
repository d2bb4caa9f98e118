"""validation/band_check.py checks a configuration's GPU repeats against its band, as compare_all names them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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
                                    "a-bench-nano", "i-longout-p90", "cal-azure")] == [
        "light", "~70 %", "~70 %", "~90-95 %", "KV pressure", "offline", "~90-95 %", "calibration rate"]

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
                                              ("conversation (Azure)", "~90-95 %", 1, 0, 1),
                                              ("prefill-heavy", "light", 1, 0, 1)]
    assert "| conversation (Azure) | light | 2 | +7.7% | +13.3% | 1 of 2 | 1 of 2 |" in out.read_text()
    assert [(s["load"], s["num_runs"], s["within_3pct"], s["within_10pct"], s["inside_band"]) for s in summary] == [
        ("light", 3, 1, 2, 2), ("~90-95 %", 1, 0, 1, 1)]
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


def _compare_json(folder, ttft_real: float, ttft_sim: float, in_band: bool | None, device: str = "NVIDIA H200"):
    """A compare.json as analysis.compare writes it: TTFT p50 as given, every other headline figure equal."""
    import json

    from validation.compare_all import HEADLINE

    folder.mkdir(parents=True)
    metrics = [{"key": key, "real": ttft_real if key == "ttft_ms.p50" else 10.0,
                "sim": ttft_sim if key == "ttft_ms.p50" else 10.0, "in_band": in_band} for key in HEADLINE]
    (folder / "compare.json").write_text(json.dumps({"real": {"config": {"device": device}},
                                                     "sim": {"cost_model": "profile:x"}, "metrics": metrics}))


def test_fidelity_summary_reads_compare_all_folders_with_each_configurations_gpu_spread(tmp_path, capsys):
    import json

    from validation.fidelity_summary import main

    h200, h100 = tmp_path / "h200", tmp_path / "h100"
    _compare_json(h200 / "b-azure-p70", 100.0, 104.0, True)  # +4 %
    _compare_json(h200 / "b-azure-p70-b", 100.0, 96.0, False)  # -4 %
    _compare_json(h200 / "b-azure-p70-b-vs-b-azure-p70", 100.0, 95.0, None)  # the GPU runs 5 % apart
    _compare_json(h200 / "c-mooncake", 100.0, 104.0, True)  # +4 %, run once: held to 3 %
    _compare_json(h100 / "i-longout-p90", 20.0, 22.2, True, device="NVIDIA H100")  # +11 %
    (h100 / "notes").mkdir()  # no compare.json: not a run
    out = tmp_path / "current.md"
    assert main(["--results", str(h200), "--results", str(h100), "--out", str(out)]) == 0
    text, written = out.read_text(), json.loads(out.with_suffix(".json").read_text())
    command = f"python validation/fidelity_summary.py --results {h200} --results {h100} --out {out}"
    assert text.splitlines()[0] == f"`{command}`" and written["command"] == command
    assert [(r["run"], r["device"]) for r in written["runs"]] == [
        ("b-azure-p70", "NVIDIA H200"), ("b-azure-p70-b", "NVIDIA H200"), ("c-mooncake", "NVIDIA H200"),
        ("i-longout-p90", "NVIDIA H100")]
    ttft = [(s["shape"], s["load"], s["device"], s["num_runs"], round(s["median_error"], 4),
             round(s["largest_error"], 4), s["within_3pct"], s["within_spread"], s["within_10pct"], s["inside_band"])
            for s in written["by_figure"] if s["figure"] == "ttft_ms.p50"]
    assert ttft == [("conversation (Azure)", "~70 %", "NVIDIA H200", 2, 0.0, 0.04, 0, 2, 2, 1),
                    ("long context, prefix reuse (Mooncake)", "~70 %", "NVIDIA H200", 1, 0.04, 0.04, 0, 0, 1, 1),
                    ("long outputs, bursty, held out", "~90-95 %", "NVIDIA H100", 1, 0.11, 0.11, 0, 0, 0, 1)]
    assert ("| conversation (Azure) | ~70 % | NVIDIA H200 | ttft_ms.p50 | 2 | +0.0% | +4.0% | 0 of 2 | 2 of 2 | "
            "2 of 2 | 1 of 2 |") in text
    # 4 runs x 7 figures: the 24 equal ones within 3 %; run b's 7 outside the band
    # the table by shape: the long-output run's six latency figures, TTFT p50 +11 % among them
    assert text.rstrip().endswith("| long outputs, bursty, held out | ~90-95 % | 6 | +0.0% | +11.0% | 5 of 6 | "
                                  "5 of 6 |")
    assert "In all, of 28 GPU figures: 24 within 3 %, 26 within spread, 21 inside the p5-p95 band." in text


@pytest.mark.parametrize(("folder", "argv", "message"), [
    ("x-unplanned", [], "{tmp}/r/x-unplanned/compare.json: x-unplanned is no run of validation/compare_all.py's PLAN "
                        "(nor a repeat of one); expected a compare_all --results folder"),
    ("b-azure-p70", ["bands.json"], "expected bands.json files or --results folders, one of the two"),
])
def test_fidelity_summary_refuses_what_is_no_compare_all_folder(tmp_path, capsys, folder, argv, message):
    from tests.traces.helpers import cli_error
    from validation.fidelity_summary import main

    _compare_json(tmp_path / "r" / folder, 1.0, 1.0, True)
    line = cli_error(main, [*argv, "--results", str(tmp_path / "r")], capsys)
    assert line == "error: " + message.format(tmp=tmp_path)
    line = cli_error(main, ["--results", str(tmp_path)], capsys)  # the folder above: no RUN/compare.json
    assert line == (f"error: --results {tmp_path}: no RUN/compare.json; expected a validation/compare_all.py "
                    "--results folder")


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
