"""The context of every running sequence at sampled large decode steps of two GPU runs, rebuilt from their request
tables (prompt tokens plus the tokens before the step), for decode_real_batches.py. From the repository root, with
the runs unpacked under validation/runs/s14/real/."""

import json
import sys

sys.path.insert(0, ".")
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from sim.batch_features import read_steps  # noqa: E402

OUT = "validation/results/machine-f-2026-12-03/probe/contexts.json"


def main() -> None:
    out = []
    for run, want in [("h-sharegpt-p70", 5), ("h-longout-p90", 3)]:
        folder = f"validation/runs/s14/real/{run}"
        req = pl.read_parquet(f"{folder}/requests.parquet")
        prompts = req["prompt_tokens"].to_numpy()
        times = [np.asarray(t) for t in req["token_times_s"].to_list()]
        table = pl.read_parquet(f"{folder}/steps.parquet").sort("step")
        starts = table["start_s"].to_numpy()
        ends = starts + table["duration_s"].to_numpy()
        first = np.array([t[0] if len(t) else np.inf for t in times])
        last = np.array([t[-1] if len(t) else -np.inf for t in times])
        steps = list(read_steps(folder, periods=True))
        picks = [k for k, (f, _, _) in enumerate(steps) if not f["num_prefill_tokens"] and f["continues_batch"]
                 and f["num_decode_seqs"] >= 48 and f["decode_context_tokens"] >= 95000]
        rng = np.random.default_rng(1)
        for k in sorted(rng.choice(picks, size=min(want, len(picks)), replace=False)):
            s0, s1 = starts[k], ends[k] + 1e-4  # a sequence in the step has its next token at the step's end
            ctx = []
            for i in np.flatnonzero((first < s1) & (last > s0)):
                n = np.searchsorted(times[i], s0, side="right")
                if n < len(times[i]) and times[i][n] <= s1:
                    ctx.append(int(prompts[i] + n))
            out.append({"run": run, "step": int(k), "real_ms": steps[k][1] * 1e3, "contexts": ctx})
            print(run, k, len(ctx), sum(ctx), max(ctx), round(steps[k][1] * 1e3, 2))
    with open(OUT, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
