"""Repeating decode steps of GPU runs by batch size and excess context (longest minus mean), predicted over real time.

    PROF=profile.json python steps_by_excess.py RUN_DIR [...]    (default profile: the shipped H200 qwen3-0.6b one)

Bins of excess overlap (each from its lower edge to 2.5x it); a bin with fewer than 10 steps is not printed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from sim.batch_features import read_steps  # noqa: E402
from sim.profiled_cost_model import ProfiledCostModel, find_profile, fit_profile, read_profile  # noqa: E402

BATCH_BINS = ((1, 4), (4, 8), (8, 12), (12, 16), (16, 32), (32, 64), (64, 128), (128, 600))
EXCESS_EDGES = (0, 2000, 5000, 10000, 20000)


def main(runs: list[str]) -> None:
    profile = Path(os.environ.get("PROF") or find_profile("qwen3-0.6b", "h200"))
    model = ProfiledCostModel(fit_profile(read_profile(profile)), "profile")
    rows = []
    for run in runs:
        for f, real_s, _ in read_steps(Path(run), periods=True):
            if f["num_prefill_tokens"] or not f["continues_batch"]:
                continue
            n = f["num_decode_seqs"]
            mean = f["decode_context_tokens"] / n
            rows.append((n, mean, f.get("max_decode_context_tokens", 0) - mean, real_s, model.predict(f)))
    a = np.array(rows)
    for lo, hi in BATCH_BINS:
        s = a[(a[:, 0] >= lo) & (a[:, 0] < hi)]
        if len(s) < 20:
            continue
        print(f"bs {lo}-{hi - 1}: n={len(s)} real {1e3 * s[:, 3].mean():.2f} ms pred/real "
              f"{s[:, 4].sum() / s[:, 3].sum():.3f}")
        for edge in EXCESS_EDGES:
            m = (s[:, 2] >= edge) & (s[:, 2] < (edge * 2.5 if edge else 2000))
            if m.sum() >= 10:
                print(f"   excess {edge}-: n={m.sum()} mean ctx {s[m, 1].mean():.0f} pred/real "
                      f"{s[m, 4].sum() / s[m, 3].sum():.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
