"""validation/grid_offsets.py: the grid points' offsets (sim.bands' rule), weighted by the replayed steps nearest
each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sim.bands import _residual_pools, band_points, grid_model, grid_offset  # noqa: E402
from sim.profiled_cost_model import _is_graph_step  # noqa: E402
from validation.grid_offsets import NEAREST_FEATURES, main, nearest_counts, offset_lines  # noqa: E402

H200 = REPO / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"


def _point(**features) -> dict:
    return {"features": {name: features.get(name, 0) for name in NEAREST_FEATURES}}


def test_each_step_counts_for_the_grid_point_nearest_it_on_a_log_scale():
    points = [_point(num_prefill_tokens=64, num_prefill_seqs=1), _point(num_prefill_tokens=4096, num_prefill_seqs=1)]
    steps = {name: np.zeros(3) for name in NEAREST_FEATURES}
    steps["num_prefill_seqs"] = np.ones(3)
    # 600 tokens is nearer 4096 than 64 on the log scale: 2.8 doublings from it against 3.2
    steps["num_prefill_tokens"] = np.array([100.0, 600.0, 5000.0])
    assert nearest_counts(points, steps, np.array([1.0, 2.0, 4.0])).tolist() == [1.0, 6.0]


def test_a_points_offset_is_its_median_over_the_grid_price_the_bands_draw_from():
    profile = json.loads(H200.read_text())
    grid = grid_model(profile["fit"])
    point = next(p for p in profile["points"] if not _is_graph_step(p["features"], grid.max_graph_bs))
    slower = {**point, "median_s": 1.25 * grid.predict(point["features"], 1.0)}
    assert grid_offset(grid, slower) == pytest.approx(0.25, rel=1e-12)
    eager = [grid_offset(grid, p) for p in band_points(profile) if not _is_graph_step(p["features"], grid.max_graph_bs)]
    assert eager == _residual_pools(profile)[3].tolist()  # one rule: the offsets sim.bands draws


def test_the_weighted_means_are_the_offsets_of_the_points_the_steps_are():
    profile = json.loads(H200.read_text())
    grid = grid_model(profile["fit"])
    points = band_points(profile)  # the 16-token prefill timed after the largest decode point left out
    decode = next(p for p in points if _is_graph_step(p["features"], grid.max_graph_bs))
    eager = sorted((p for p in points if not _is_graph_step(p["features"], grid.max_graph_bs)),
                   key=lambda p: -abs(grid_offset(grid, p)))[:2]
    # two steps at the largest eager offset's point (1 s and 3 s), one at the next (4 s), one at the decode point
    chosen = [eager[0], eager[0], eager[1], decode]
    steps = {name: np.array([p["features"][name] for p in chosen], dtype=float) for name in NEAREST_FEATURES}
    steps["duration_s"] = np.array([1.0, 3.0, 4.0, 0.002])
    rows, outliers = offset_lines("h200", profile, steps)
    first, second = (grid_offset(grid, p) for p in eager)
    by_steps = (2 * first + second) / 3
    by_time = (4 * first + 4 * second) / 8
    assert rows[1] == f"| h200 | eager | 82 | +0.35% | +0.66% | {by_steps:+.2%} | {by_time:+.2%} | 1 | 3 |"
    assert rows[0].split(" | ")[5:7] == [f"{grid_offset(grid, decode):+.2%}"] * 2  # the decode step's point alone
    assert len(outliers) == 6
    assert outliers[3] == ("- h200 eager mixed (num_prefill_tokens 1024, num_prefill_seqs 1, prefill_context_tokens "
                           "2048, num_decode_seqs 32, decode_context_tokens 16480): +13.7%; the others' mean +0.18%; "
                           "nearest to 66.67% of the regime's replayed steps")


@pytest.mark.parametrize("runs, message", [
    ("h200", "--runs: expected GPU:RESULTS (h200:validation/results/...), got 'h200'"),
    ("h200:{tmp}", "--runs h200:{tmp}: no <run>/real_summary.json of a planned run; expected a folder of committed "
                   "GPU summaries"),
    ("l40s:validation/results/h100-longctx-session41", "--runs l40s:validation/results/h100-longctx-session41: no "
                                                        "shipped qwen3-0.6b profile for GPU 'l40s'"),
])
def test_bad_runs_are_refused_in_one_line_before_any_replay(tmp_path, capsys, monkeypatch, runs, message):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exc:
        main(["--runs", runs.format(tmp=tmp_path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: {message.format(tmp=tmp_path)}\n")
