"""The skewed points' excess as a soft maximum of the KV-bandwidth time and the longest context's time, per exponent.

    python soft_max_fit.py PROFILE.json skew-points-h100.json RUN_DIR [...]

For each exponent p, fits b per batch size to the twins (attention time (A^p + (b x longest)^p)^(1/p), A = the grid's
per-token slope x KV tokens), prints the fit's RMS error on the twins and the predicted over real time of the runs'
repeating decode steps of 2+ rows, by batch size (the profile's grid and serving factors, its own skew term off).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from sim.batch_features import read_steps  # noqa: E402
from sim.profiled_cost_model import ProfiledCostModel, fit_profile, read_profile  # noqa: E402

BATCH_BINS = ((2, 4), (4, 8), (8, 12), (12, 16), (16, 32), (32, 64), (64, 257))


def main(profile_path: str, skew_path: str, runs: list[str]) -> None:
    fit = fit_profile(read_profile(Path(profile_path)))
    decode = fit["graph_decode"]
    base = ProfiledCostModel(fit, "grid")
    base._per_excess_s = [0.0] * len(base._per_excess_s)  # the soft maximum replaces the profile's skew term
    buckets = base._graph_bucket

    def slope(rows: int) -> float:
        return float(np.interp(buckets[rows], decode["batch_sizes"], decode["per_kv_token_s"]))

    twins = []  # rows, KV tokens, longest context, the skewed batch's attention time beyond the grid's fixed part
    for q in json.loads(Path(skew_path).read_text())["skew_points"]:
        f = q["features"]
        rows, kv = f["num_decode_seqs"], f["decode_context_tokens"]
        equal_s = q["equal_median_s"] + slope(rows) * (kv - q["equal_decode_context_tokens"])
        twins.append((rows, kv, f["max_decode_context_tokens"], q["median_s"] - equal_s + slope(rows) * kv))
    twins = np.array(twins)
    steps = [(f, real_s) for run in runs for f, real_s, _ in read_steps(Path(run), periods=True)
             if not f["num_prefill_tokens"] and f["continues_batch"] and f["num_decode_seqs"] >= 2]

    def soft(a, b, p):
        return (a ** p + b ** p) ** (1 / p)

    for p in (2, 3, 4, 6, 8):
        per_rows = {}
        for rows in sorted(set(twins[:, 0].astype(int))):
            m = twins[:, 0] == rows
            a = slope(rows) * twins[m, 1]
            candidates = np.linspace(1e-9, 1e-6, 4000)
            errors = [((soft(a, c * twins[m, 2], p) - twins[m, 3]) ** 2).sum() for c in candidates]
            per_rows[rows] = candidates[int(np.argmin(errors))]
        sizes = sorted(per_rows)

        def extra_s(rows: int, kv: int, longest: int, p=p, sizes=sizes, per_rows=per_rows) -> float:
            b = float(np.interp(buckets[rows], sizes, [per_rows[s] for s in sizes]))
            return soft(slope(rows) * kv, b * longest, p) - slope(rows) * kv

        rms_ms = 1e3 * np.sqrt(np.mean([(extra_s(int(r), kv, mx) - (y - slope(int(r)) * kv)) ** 2
                                        for r, kv, mx, y in twins]))
        out = []
        for lo, hi in BATCH_BINS:
            chosen = [(f, r) for f, r in steps if lo <= f["num_decode_seqs"] < hi]
            if len(chosen) >= 30:
                predicted = sum(base.predict(f) + base.repeat_factor * extra_s(
                    f["num_decode_seqs"], f["decode_context_tokens"], f["max_decode_context_tokens"])
                    for f, _ in chosen)
                out.append(f"{lo}-{hi - 1}: {predicted / sum(r for _, r in chosen):.3f}")
        print(f"p={p}: twins' RMS error {rms_ms:.3f} ms; predicted/real by rows " + " ".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
