"""sim.calibrate records how the host's speed varied (serving.host_episodes), and sim.bands draws from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.core.records import STEP_COLUMNS
from sim.bands import band_model
from sim.calibrate import main as calibrate_main
from sim.config import SimConfig
from sim.host_episodes import fit_host_episodes
from sim.profiled_cost_model import ProfiledCostModel, find_profile

PROFILE = find_profile("qwen3-0.6b", "h200")
STEP_INT_COLUMNS = [c.name for c in STEP_COLUMNS if c.dtype == "int64"]
SLOW_WINDOWS = {5, 6, 7, 8, 14, 15}  # of 20 two-second windows: two episodes, of 8 s and 4 s


def _episodic_run(path: Path) -> Path:
    """Host-bound prefill steps, 5 per 2-s window, at 1.8x the grid in SLOW_WINDOWS and 1.0x elsewhere."""
    grid = ProfiledCostModel({**json.loads(PROFILE.read_text())["fit"], "serving": None}, "grid")
    f = {"num_seqs": 1, "num_prefill_seqs": 1, "num_prefill_tokens": 32, "prefill_context_tokens": 0,
         "num_decode_seqs": 0, "decode_context_tokens": 0, "prefill_attention_pairs": 32 * 33 // 2,
         "max_decode_context_tokens": 0}
    floor, gpu = grid.eager_parts(f)
    assert floor > gpu  # host-bound on the grid
    rows = []
    for w in range(20):
        for i in range(5):
            slowdown = 1.8 if w in SLOW_WINDOWS else 1.0
            rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": len(rows), "start_s": 2.0 * w + 0.3 * i,
                         "duration_s": float(grid.combine(slowdown * floor, gpu))})
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}')  # as engine.replay's says
    return path


def test_the_slow_episodes_of_one_run_are_recorded_and_drive_the_bands(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    assert calibrate_main([str(profile), str(_episodic_run(tmp_path / "run"))]) == 0
    episodes = json.loads(profile.read_text())["serving"]["host_episodes"]
    assert episodes == {"slow_over_normal": 1.8, "slow_share_range": [0.3, 0.3], "mean_episode_s": 6.0,
                        "window_s": 2.0, "num_windows": 20, "slow_window": 1.3}
    bands = band_model(SimConfig(cost_model=str(profile)), SimConfig().model_shape)
    assert (bands.slow_over_normal, bands.slow_share_range, bands.mean_episode_s) == (1.8, (0.3, 0.3), 6.0)


def test_too_few_windows_record_nothing() -> None:
    steps = [(1.0, 1.0, 2.0 * w + 0.1 * i) for w in range(9) for i in range(3)]
    assert fit_host_episodes([steps]) is None  # 9 windows < 10
    steps = [(1.0, 1.0, 2.0 * w + 0.1 * i) for w in range(12) for i in range(3)]
    assert fit_host_episodes([steps]) == {"slow_over_normal": 1.0, "slow_share_range": [0.0, 0.0],
                                          "mean_episode_s": 2.0, "window_s": 2.0, "num_windows": 12,
                                          "slow_window": 1.3}
