"""Probe F (session 29) of sampling priced as measured (fit.sampling, sim.replay --temperature/--top-k/--top-p).

Findings (input; before; after):

1. A sampled replay whose prompts are chunked (a 5,000-token prompt at --max-num-batched-tokens 2048, top-k 20 on a
   profile that prices it): the eager path charged sampling_s(num_seqs), every row of the step, while the engine's
   runner samples a prefill chunk only where it ends its prompt (ModelRunner.plan's sample_rows). Before: the prompt's
   first two chunks, which sample nothing, took sampling_s(1) (0.4 ms) each, and a mixed step of one unfinished chunk
   and two decodes took sampling_s(3); over a run with preemptions the rows charged outnumbered the tokens sampled.
   After: sampled_rows(batch) counts the decode rows and the chunks that end their sequence's tokens (step_time_s
   passes it to predict); the rows charged over a run are its output tokens, preemptions and chunking included. A
   prompt's 1-token chunk that leaves it unfinished (a row the features count as a decode) samples nothing either:
   counted by the same rule in steps with prefills (600 offline prompts: counting every decode row charged 90,159
   rows for 90,158 tokens).
2. sampling_points holding two points of one mode and batch size (hand-merged profiles, two contexts): before, sim.
   fit_profile and sim.replay took the later one's extra without a word (1 ms and 7 ms measured: 7 ms a step). After:
   a one-line error naming the second point and the first.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl
import pytest

from sim.config import SimConfig
from sim.profiled_cost_model import ProfiledCostModel, fit_profile, read_profile
from sim.simulator import simulate
from tests.sim.helpers import make_trace, result_tables

SHIPPED = Path(__file__).resolve().parents[2] / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"
FILTERS = {"batch_sizes": [1, 32, 48, 64, 128, 256], "extra_s": [4e-4, 1.7e-3, 2.0e-3, 2.1e-3, 2.2e-3, 3.4e-3]}


@pytest.fixture(scope="module")
def sampled_profile(tmp_path_factory) -> Path:
    profile = json.loads(SHIPPED.read_text())
    profile["fit"]["sampling"] = {"filters": FILTERS}
    path = tmp_path_factory.mktemp("profile") / "qwen3-0.6b.json"
    path.write_text(json.dumps(profile))
    return path


def test_a_prefill_chunk_that_does_not_end_its_prompt_pays_no_sampling(sampled_profile):
    trace = make_trace([5000, 300, 7000, 20], [10, 30, 5, 40])
    options = {"cost_model": str(sampled_profile), "max_num_batched_tokens": 2048}
    _, greedy = result_tables(simulate(trace, SimConfig(**options)))
    _, sampled = result_tables(simulate(trace, SimConfig(**options, temperature=0.6, top_k=20)))
    assert sampled.drop("start_s", "duration_s").equals(greedy.drop("start_s", "duration_s"))
    model = ProfiledCostModel.load(sampled_profile, sampling="filters")
    added = (sampled["duration_s"] - greedy["duration_s"]).to_list()
    # Steps 0 and 1: the 5,000-token prompt's first two chunks, alone. Step 2: its last chunk, the 300-token prompt
    # and the 7,000-token prompt's first chunk (two end their prompt). Step 3: a chunk of that prompt beside 2 decodes.
    assert sampled["num_prefill_seqs"].to_list()[:4] == [1, 1, 3, 1]
    assert added[:2] == [0.0, 0.0]
    assert added[2] == pytest.approx(model.sampling_s(2), rel=1e-9)
    assert added[3] == pytest.approx(model.sampling_s(2), rel=1e-9)


def test_the_rows_charged_over_a_run_are_the_tokens_it_sampled(sampled_profile):
    """Every sampled row gives its sequence a token: with chunked prompts and preemptions (recomputed prompts sample
    again at their end), the rows priced sum to the output tokens."""
    rng = random.Random(3)  # offline: 600 prompts, one of them (402) begun with a 1-token chunk, the budget's last
    trace = make_trace([rng.randint(100, 6000) for _ in range(600)], [rng.randint(1, 300) for _ in range(600)])
    config = SimConfig(cost_model=str(sampled_profile), max_num_batched_tokens=2048, num_gpu_blocks=400,
                       temperature=0.6, top_k=20)
    model = ProfiledCostModel.load(sampled_profile, sampling="filters")
    charged = []
    priced = model.sampling_s
    model.sampling_s = lambda rows: charged.append(rows) or priced(rows)  # the eager steps' (graph decodes: a table)
    requests, steps = result_tables(simulate(trace, config, cost_model=model, fast_forward=False))
    graph = steps.filter((pl.col("num_prefill_tokens") == 0) & (pl.col("num_decode_seqs") <= model.max_graph_bs))
    assert steps["num_preempted"].sum() > 0 and len(charged) == steps.height - graph.height
    assert sum(charged) + graph["num_decode_seqs"].sum() == requests["output_tokens"].sum()


def test_two_sampled_points_of_one_mode_and_batch_size_are_refused():
    profile = read_profile(SHIPPED)
    point = {"family": "decode", "sampling": "filters", "decode": [1, 1024], "median_s": 3e-3, "greedy_median_s": 2e-3}
    profile["sampling_points"] = [point, {**point, "decode": [1, 2048], "median_s": 9e-3}]
    with pytest.raises(ValueError, match=r"^sampling_points\[1\]: a second 'filters' point of batch size 1 \(also "
                                         r"sampling_points\[0\]\); expected one a sampling mode and batch size"):
        fit_profile(profile)
    profile["sampling_points"] = [point, {**point, "sampling": "temperature"}]  # one of each mode: both kept
    assert set(fit_profile(profile)["sampling"]) == {"filters", "temperature"}
