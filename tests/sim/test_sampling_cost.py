"""Sampling priced as the profile measured it: sim.replay --temperature / --top-k / --top-p add, to every step, what
sim.profile's sampled decode points took beyond the greedy ones (fit.sampling), identically step by step and in quiet
windows; a profile without such points prices greedy steps and says so (sampling_not_measured)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.core.sampling_params import sampling_mode
from engine.core.scheduler import ScheduledBatch
from sim.config import SimConfig
from sim.profiled_cost_model import ProfiledCostModel, check_fit, fit_profile, read_profile
from sim.simulator import simulate
from tests.sim.helpers import make_trace, read_outputs, result_tables, run_cli, write_trace

SHIPPED = Path(__file__).resolve().parents[2] / "sim" / "profiles" / "h200" / "qwen3-0.6b.json"
# Made-up extras (seconds a step) at the batch sizes sim.profile measures, of the shape the H200 showed: the sort's
# cost grows with the rows up to 48, the floors' is flat, then grows past a row an SM.
FILTERS = {"batch_sizes": [1, 32, 48, 64, 128, 256], "extra_s": [4e-4, 1.7e-3, 2.0e-3, 2.1e-3, 2.2e-3, 3.4e-3]}
TEMPERATURE = {"batch_sizes": [1, 256], "extra_s": [2e-5, 1e-4]}


@pytest.fixture(scope="module")
def sampled_profile(tmp_path_factory) -> Path:
    profile = json.loads(SHIPPED.read_text())
    profile.pop("sampling_points", None)  # the made-up extras below are the only ones (refits would take the points')
    profile["fit"]["sampling"] = {"filters": FILTERS, "temperature": TEMPERATURE}
    path = tmp_path_factory.mktemp("profile") / "qwen3-0.6b.json"
    path.write_text(json.dumps(profile))
    return path


def _decode_batch(bs: int, context: int, continues: int) -> ScheduledBatch:
    batch = ScheduledBatch(seqs=[None] * bs, num_new_tokens=[1] * bs, num_decode_seqs=bs, continues_batch=continues)
    batch.decode_context_tokens, batch.max_decode_context_tokens = bs * context, context
    return batch


def test_the_mode_follows_the_engines_sampler():
    assert sampling_mode(0.0, 20, 0.95, 1000) == "greedy"
    assert sampling_mode(5e-6, 20, 0.95, 1000) == "greedy"  # below GREEDY_BELOW_TEMPERATURE: an argmax
    assert sampling_mode(0.6, -1, 1.0, 1000) == "temperature"
    assert sampling_mode(0.6, 1000, 1.0, 1000) == "temperature"  # k past the vocabulary keeps every token: off
    assert sampling_mode(0.6, 999, 1.0, 1000) == "filters"
    assert sampling_mode(0.6, 0, 0.95, 1000) == "filters"


def test_steps_pay_the_measured_extra_and_greedy_pays_nothing(sampled_profile):
    greedy = ProfiledCostModel.load(sampled_profile)
    filters = ProfiledCostModel.load(sampled_profile, sampling="filters")
    assert filters.name.endswith("sampling with top-k/top-p as measured") and greedy.prices_sampling
    # Interpolated between the measured batch sizes, by the rows that sample (not the graph bucket)
    assert filters.sampling_s(40) == pytest.approx(1.7e-3 + (2.0e-3 - 1.7e-3) * 8 / 16, abs=1e-15)
    assert filters.sampling_s(256) == 3.4e-3
    assert filters.sampling_s(512) == pytest.approx(6.8e-3)  # beyond the grid: the largest batch's cost per row
    for bs, continues in ((1, 1), (40, 0), (40, 1), (256, 1)):
        batch = _decode_batch(bs, 900, continues)
        assert filters.step_time_s(batch) == greedy.step_time_s(batch) + filters.sampling_s(bs)
        assert filters.step_time_s(batch, 1.3) == greedy.step_time_s(batch, 1.3) + filters.sampling_s(bs)
    # An eager step: every row that samples, decode rows and prefills alike
    f = {"num_seqs": 9, "num_prefill_seqs": 1, "num_prefill_tokens": 2000, "prefill_context_tokens": 0,
         "num_decode_seqs": 8, "decode_context_tokens": 8000, "prefill_attention_pairs": 2000 * 2001 // 2,
         "max_decode_context_tokens": 1000, "continues_batch": 0, "num_batched_tokens": 2008}
    assert filters.predict(f) == greedy.predict(f) + filters.sampling_s(9)


@pytest.mark.parametrize("continues", [0, 1])
@pytest.mark.parametrize("bs", [3, 64, 200])
def test_a_run_of_decode_steps_is_priced_as_its_steps_one_by_one(sampled_profile, bs, continues):
    """decode_run_s (quiet windows) gives the very floats of step_time_s step by step, sampling included."""
    model = ProfiledCostModel.load(sampled_profile, sampling="filters")
    run = _decode_batch(bs, 700, continues)
    run.decode_context_tokens = np.arange(bs * 700, bs * 730, bs, dtype=np.int64)
    run.max_decode_context_tokens = np.arange(700, 730, dtype=np.int64)
    for slowdown in (None, 0.8):
        prices = model.decode_run_s(run, slowdown)
        one_by_one = [model.step_time_s(_decode_batch(bs, 700 + n, continues if n == 0 else 1), slowdown)
                      for n in range(30)]
        assert prices.tolist() == one_by_one


def test_a_profile_without_the_mode_prices_greedy_steps(sampled_profile, tmp_path):
    profile = json.loads(sampled_profile.read_text())
    del profile["fit"]["sampling"]["filters"]
    path = tmp_path / "qwen3-0.6b.json"
    path.write_text(json.dumps(profile))
    model = ProfiledCostModel.load(path, sampling="filters")
    assert not model.prices_sampling and model.sampling_s(64) == 0.0
    assert model.step_time_s(_decode_batch(64, 900, 1)) == ProfiledCostModel.load(path).step_time_s(
        _decode_batch(64, 900, 1))
    assert ProfiledCostModel.load(path, sampling="temperature").prices_sampling


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_sampled_replay_keeps_the_schedule_and_its_steps_take_the_extra(sampled_profile, fast_forward):
    trace = make_trace([300 + 17 * i for i in range(40)], [20 + 5 * i for i in range(40)])
    greedy = simulate(trace, SimConfig(cost_model=str(sampled_profile)), fast_forward=fast_forward)
    config = SimConfig(cost_model=str(sampled_profile), temperature=0.6, top_k=20, top_p=0.95)
    sampled = simulate(trace, config, fast_forward=fast_forward)
    _, greedy_steps = result_tables(greedy)
    sampled_requests, sampled_steps = result_tables(sampled)
    timing = ["start_s", "duration_s"]
    assert sampled_steps.drop(timing).equals(greedy_steps.drop(timing))  # offline: the same batches, step by step
    model = ProfiledCostModel.load(sampled_profile, sampling="filters")
    added = sampled_steps["duration_s"].to_numpy() - greedy_steps["duration_s"].to_numpy()
    # The rows that sample, as the tokens each step gave (a token's time is its step's end): not every row, as the
    # prompts over the first steps' 8,192-token budget are cut into chunks, and a chunk that leaves its prompt
    # unfinished samples nothing.
    ends = (sampled_steps["start_s"] + sampled_steps["duration_s"]).to_numpy()
    token_times = sampled_requests["token_times_s"].explode().to_numpy()
    rows = np.bincount(np.searchsorted(ends, token_times - 1e-9), minlength=len(ends))
    assert (rows < sampled_steps["num_seqs"].to_numpy()).any()
    expected = [model.sampling_s(n) for n in rows.tolist()]
    np.testing.assert_allclose(added, expected, rtol=1e-9, atol=1e-12)
    assert sampled.describe()["temperature"] == 0.6 and sampled.describe()["top_k"] == 20
    assert "top_k" not in greedy.describe() and "top_p" not in greedy.describe()  # recorded only when on


def test_fast_forward_changes_nothing_of_a_sampled_replay(sampled_profile):
    trace = make_trace([200 + 31 * i for i in range(60)], [40 + 7 * i for i in range(60)],
                       [0.05 * i for i in range(60)])
    config = SimConfig(cost_model=str(sampled_profile), temperature=1.0, top_p=0.9)
    on_requests, on_steps = result_tables(simulate(trace, config))
    off_requests, off_steps = result_tables(simulate(trace, config, fast_forward=False))
    assert on_steps.equals(off_steps) and on_requests.equals(off_requests)


def _unsampled_profile(tmp_path) -> Path:
    """The shipped profile as it was before sim.profile measured sampled steps."""
    profile = json.loads(SHIPPED.read_text())
    profile.pop("sampling_points", None)
    profile["fit"].pop("sampling", None)
    path = tmp_path / "qwen3-0.6b.json"
    path.write_text(json.dumps(profile))
    return path


def test_sim_replay_warns_where_the_profile_did_not_measure_the_sampling(tmp_path):
    trace = write_trace(tmp_path / "trace.parquet", [100, 200], [5, 6], [0.0, 0.1])
    result = run_cli([str(trace), "--temperature", "0.6", "--top-k", "20", "--out", str(tmp_path / "run"),
                      "--no-report", "--cost-model", str(_unsampled_profile(tmp_path))])
    assert result.returncode == 0, result.stderr
    assert "warning [sampling_not_measured]: every request samples with top-k or top-p, but the profile has no " \
           "sampled steps" in result.stdout + result.stderr
    _, _, summary = read_outputs(tmp_path / "run")
    assert [w["code"] for w in summary["warnings"]] == ["sampling_not_measured"]
    assert summary["config"]["temperature"] == 0.6 and summary["config"]["top_k"] == 20
    assert "top_p" not in summary["config"]


@pytest.mark.parametrize("args, message", [
    (["--top-p", "0"], "--top-p: top_p must be in (0, 1], got 0.0"),
    (["--top-k", "-3"], "--top-k: top_k must be -1 or 0 (off) or >= 1, got -3"),
    (["--temperature", "nan"], "--temperature: temperature must be a number from 0 to"),
])
def test_bad_sampling_options_are_one_line_errors(tmp_path, args, message):
    trace = write_trace(tmp_path / "trace.parquet", [10], [2])
    result = run_cli([str(trace), *args, "--out", str(tmp_path / "run")])
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_refits_keep_the_sampling_and_malformed_ones_are_named():
    profile = read_profile(SHIPPED)
    profile["sampling_points"] = [
        {"family": "decode", "sampling": "filters", "decode": [8, 1024], "median_s": 5e-3, "greedy_median_s": 3e-3},
        {"family": "decode", "sampling": "filters", "decode": [1, 1024], "median_s": 3e-3, "greedy_median_s": 2e-3},
        # faster than the greedy twin: noise, held at 0
        {"family": "decode", "sampling": "temperature", "decode": [8, 1024], "median_s": 2e-3,
         "greedy_median_s": 3e-3},
    ]
    fit = fit_profile(profile)  # sim.fit_profile refits the whole profile: the sampled points' fit goes with it
    assert fit["sampling"] == {"filters": {"batch_sizes": [1, 8], "extra_s": [pytest.approx(1e-3, abs=1e-15),
                                                                                pytest.approx(2e-3, abs=1e-15)]},
                               "temperature": {"batch_sizes": [8], "extra_s": [0.0]}}
    profile["fit"] = {**fit, "sampling": {"filters": {"batch_sizes": [8, 4], "extra_s": [1e-3, 2e-3]}}}
    with pytest.raises(ValueError, match=r"field 'fit.sampling.filters.batch_sizes' is \[8, 4\]; expected an "
                                         "increasing list"):
        check_fit(profile)
    profile["fit"]["sampling"] = {"top_k": FILTERS}
    with pytest.raises(ValueError, match="field 'fit.sampling' is .*expected an object of the sampling modes"):
        check_fit(profile)
    profile["sampling_points"] = [{"sampling": "filters", "decode": [0, 1024], "median_s": 1e-3}]
    with pytest.raises(ValueError, match=r"sampling_points\[0\]: expected an object with 'sampling'"):
        fit_profile(profile)
    profile["sampling_points"] = [{"sampling": "filters", "decode": [1, 1024], "median_s": 1e-3}]
    with pytest.raises(ValueError, match=r"sampling_points\[0\]: 'greedy_median_s' is None; expected a finite"):
        fit_profile(profile)


@pytest.mark.parametrize("num_replicas, router", [(1, "rr"), (2, "prefix")])
def test_identical_prompts_sampled_keep_their_continuations_apart(num_replicas, router):
    """Sampled requests of one prompt continue differently, as an engine's samples do: each simulated sequence's first
    token is its own (sim.runner.first_token_id), so no continuation's blocks hit another's in the prefix cache; a
    greedy replay keeps one token for all (identical prompts continue alike). Fast-forward changes nothing."""
    import polars as pl

    from engine.core.block_manager import prefix_block_hashes
    from sim.runner import SIMULATED_TOKEN_ID, first_token_id
    from tests.sim.helpers import trace_frame
    from traces.schema import Trace

    prompt = list(range(100, 164))
    frame = trace_frame([64] * 12, [40 + i for i in range(12)], [0.01 * i for i in range(12)])
    trace = Trace.from_frame(frame.with_columns(pl.Series("prompt_token_ids", [prompt] * 12)), "one prompt")
    assert first_token_id(0) != first_token_id(1) and first_token_id(0) < SIMULATED_TOKEN_ID
    assert prefix_block_hashes([*prompt, first_token_id(3)] + [-1] * 15, 16)[-1] != \
        prefix_block_hashes([*prompt, first_token_id(4)] + [-1] * 15, 16)[-1]
    config = SimConfig(temperature=0.8, block_size=16, num_gpu_blocks=12, num_replicas=num_replicas, router=router)
    on_requests, on_steps = result_tables(simulate(trace, config))
    off_requests, off_steps = result_tables(simulate(trace, config, fast_forward=False))
    assert on_steps.equals(off_steps) and on_requests.equals(off_requests)
    if num_replicas == 1:  # preempted requests came back on another's continuation (greedy) or on their own only
        greedy_requests, _ = result_tables(simulate(trace, SimConfig(block_size=16, num_gpu_blocks=12)))
        assert on_requests["num_preemptions"].sum() == 23 and greedy_requests["num_preemptions"].sum() == 24
