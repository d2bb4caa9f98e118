"""python -m sim.profile end to end on CPU with a tiny random model: every grid family is measured and fitted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sim.helpers import save_tiny_qwen3

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("decode_steps", [1, 3])
def test_profile_cli_measures_every_family_and_fits(tmp_path, decode_steps):
    from sim.profile import main as profile_main
    from sim.profile import row_context
    from sim.profiled_cost_model import ProfiledCostModel

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=20000)
    out = tmp_path / "profile.json"
    assert profile_main([
        "--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--repeats", "1", "--max-model-len", "20000",
        "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--gpu", "h200", "--out", str(out),
        "--decode-steps", str(decode_steps),
    ]) == 0
    profile = json.loads(out.read_text())
    assert profile["decode_steps_per_sample"] == decode_steps
    families = {p["family"] for p in profile["points"]}
    assert families == {"decode", "decode_skewed", "decode_after_eager", "prefill", "multi_prefill", "mixed"}
    for p in profile["points"]:
        f = p["features"]
        assert p["median_s"] > 0 and len(p["times_s"]) == 1
        if p["family"] == "decode_skewed":  # one long context among short ones (one token longer after the warm-up)
            assert f["max_decode_context_tokens"] == row_context(p["long_decode"][1], 256, decode_steps + 1) + 1
            assert f["num_decode_seqs"] == p["decode"][0] + 1
        # A large batch's decode rows are plain decodes when timed, as in serving: the scheduler checks none of them
        # one by one, only a joining prefill (engine.core.steady_decodes); a small batch's rows it checks all.
        num_rows = p["decode"][0] + p["long_decode"][0]
        if p["family"] in ("decode", "decode_skewed"):
            assert p["checked_rows"] == (0 if num_rows >= 32 else num_rows)
        if p["family"] == "mixed":
            assert p["checked_rows"] == (1 if num_rows >= 32 else num_rows + 1)
        if p["family"] == "decode_after_eager":  # timed: the decode step after the prefill, with its sequence
            assert f["num_prefill_tokens"] == 0 and f["num_decode_seqs"] == p["decode"][0] + 1
    # Every row sampling, with temperature and with filters, beside the greedy decode point of the same batch at
    # 1,024 tokens (the quick grid: its smallest and largest such batch); kept apart from the greedy points.
    sampled = profile["sampling_points"]
    assert {(p["sampling"], tuple(p["decode"])) for p in sampled} == {
        (mode, (bs, 1024)) for mode in ("temperature", "filters") for bs in (1, 48)}
    assert all("sampling" not in p for p in profile["points"])
    greedy = {tuple(p["decode"]): p["median_s"] for p in profile["points"] if p["family"] == "decode"}
    assert all(p["greedy_median_s"] == greedy[tuple(p["decode"])] for p in sampled)  # the same passes' greedy twin
    fit = profile["fit"]
    for mode in ("temperature", "filters"):
        assert fit["sampling"][mode] == {"batch_sizes": [1, 48], "extra_s": [
            max(0.0, p["median_s"] - p["greedy_median_s"]) for p in sorted(sampled, key=lambda p: p["decode"])
            if p["sampling"] == mode]}
    assert fit["held_out"]["num_points"] > 0 and "per_excess_context_token_s" in fit["graph_decode"]
    model = ProfiledCostModel.load(out)
    assert all(model.predict(p["features"]) > 0 for p in profile["points"])


def test_row_context_keeps_the_timed_steps_off_block_boundaries():
    from sim.profile import row_context

    # A multiple of the block size would put the first step at a block's last slot and the next at a new block.
    assert row_context(512, 256, 3) == 514
    assert row_context(16384, 256, 6) == 16386
    assert row_context(32, 256, 6) == 32  # positions 31..36 sit inside the first block already
    assert row_context(250, 256, 6) == 250  # positions 249..254: the last (255) is not reached
    assert row_context(252, 256, 6) == 258  # positions 251..256 would open a block: moved to 257..262
    assert row_context(16, 16, 5) == 18
    assert row_context(20, 16, 20) == 20  # a block too small to hold the steps: left as it is
    for ctx in range(1, 600):
        for steps in (1, 2, 3, 6):
            shifted = row_context(ctx, 16, steps)
            positions = range(shifted - 1, shifted - 1 + steps)
            assert 0 <= shifted - ctx < 16
            assert all(p % 16 not in (0, 15) for p in positions), (ctx, steps)


def test_the_profiler_launches_steps_ahead_only_between_a_decode_points_timed_steps():
    """A step launched ahead behind a point's last timed step made the next point wait for it (a 16-token prefill
    after a full-batch decode point took 15 ms instead of 2.2); one launched from a mixed point's untimed decode
    step was thrown away by its prefill and waited for. Only the steps a decode point times one after another are
    launched ahead (from the untimed step on), the last of them launching none."""
    from types import SimpleNamespace

    from sim.profile import GridPoint, measure_once

    launches = []

    class Runner:
        run_ahead = True

    class Engine:
        def __init__(self):
            self.runner = Runner()
            self.scheduler = SimpleNamespace(block_manager=SimpleNamespace(block_size=16))

        def step(self):
            launches.append(self.runner.run_ahead)
            from engine.core.scheduler import ScheduledBatch
            return ScheduledBatch(), []

    class Injector:
        def add(self, *args, **kwargs):
            pass

        def clear(self):
            pass

    engine = Engine()
    measure_once(engine, Injector(), GridPoint("decode", decode=(4, 100)), decode_steps=3)
    assert launches == [True, True, True, False] and engine.runner.run_ahead is True
    launches.clear()
    measure_once(engine, Injector(), GridPoint("mixed", decode=(4, 100), prefill=((0, 64),)))
    assert launches == [False, False] and engine.runner.run_ahead is True
    launches.clear()
    measure_once(engine, Injector(), GridPoint("prefill", prefill=((0, 16),)))
    assert launches == [False] and engine.runner.run_ahead is True


def test_sampling_only_adds_the_sampled_points_to_an_existing_profile(tmp_path, capsys):
    """--sampling-only measures the sampled decode points and their greedy twins alone and writes them into the
    profile --out, keeping its other points, fit and calibration (the shipped profiles predate sampled points)."""
    from sim.profile import main as profile_main
    from sim.profiled_cost_model import PROFILE_DIR, ProfiledCostModel

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=20000)
    out = tmp_path / "profile.json"
    before = json.loads((PROFILE_DIR / "h200" / "qwen3-0.6b.json").read_text())
    before["model"] = str(tmp_path / "model")  # a profile of this model, measured before sampled points existed
    before["device"] = "cpu"  # ... on the CPU, which measures the sampled points here
    for key in ("sampling_points", "sampling_measured_at", "sampling_decode_steps_per_sample"):
        before.pop(key, None)
    before["fit"].pop("sampling", None)
    out.write_text(json.dumps(before))
    args = ["--model", str(tmp_path / "model"), "--device", "cpu", "--quick", "--repeats", "1", "--max-model-len",
            "20000", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--gpu", "h200", "--out", str(out)]
    assert profile_main([*args, "--sampling-only"]) == 0
    after = json.loads(out.read_text())
    assert {(p["sampling"], tuple(p["decode"])) for p in after["sampling_points"]} == {
        (mode, (bs, 1024)) for mode in ("temperature", "filters") for bs in (1, 48)}
    assert set(after["fit"]["sampling"]) == {"temperature", "filters"}
    assert after["sampling_decode_steps_per_sample"] == 1  # --decode-steps' default, recorded beside the points
    assert {k: v for k, v in after.items() if k not in ("sampling_points", "fit", "sampling_measured_at",
                                                       "sampling_decode_steps_per_sample")} == {
        k: v for k, v in before.items() if k != "fit"}
    assert {k: v for k, v in after["fit"].items() if k != "sampling"} == before["fit"]
    assert ProfiledCostModel.load(out, sampling="filters").prices_sampling
    # Another deployment's profile, or none, is refused before the model loads
    shipped = PROFILE_DIR / "h200" / "qwen3-0.6b.json"
    with pytest.raises(SystemExit) as exited:
        profile_main([*args[:-1], str(shipped), "--sampling-only"])
    assert exited.value.code == 2 and "was measured for qwen3-0.6b on h200 at tensor-parallel size 1, not model" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        profile_main([*args[:-1], str(tmp_path / "none.json"), "--sampling-only"])
    assert exited.value.code == 2 and capsys.readouterr().err.startswith(
        "error: --out (with --sampling-only, the profile to add to): ")


def test_every_shipped_profile_loads_for_the_deployment_its_folder_names() -> None:
    """Each sim/profiles/<gpu>/<model>.json loads as a cost model for exactly that model and GPU (the one a replay with
    --gpu <gpu> --model <model> prices with), carries sampled points timed over several decode steps in a row or says
    otherwise, and a replay on the H100 (profiles measured in the thirty-first session) no longer falls back to the
    roofline."""
    from sim.config import SimConfig
    from sim.profiled_cost_model import PROFILE_DIR, ProfiledCostModel, find_profile
    from sim.simulator import make_cost_model

    shipped = sorted(PROFILE_DIR.glob("*/*.json"))
    assert {(p.parent.name, p.stem) for p in shipped} >= {("h200", "qwen3-0.6b"), ("h200", "qwen3-8b"),
                                                          ("h100", "qwen3-0.6b"), ("h100", "qwen3-8b")}
    for path in shipped:
        profile = json.loads(path.read_text())
        assert (profile["gpu"], Path(profile["model"]).name) == (path.parent.name, path.stem), path
        model = ProfiledCostModel.load(path, model=path.stem, gpu=path.parent.name, tensor_parallel_size=1,
                                       sampling="filters")
        assert model.prices_sampling, path
        assert find_profile(path.stem, path.parent.name) == path
    config = SimConfig(gpu="h100")
    cost_model = make_cost_model(config, config.model_shape)
    assert cost_model.name.startswith("profile:h100/qwen3-0.6b") and "serving-calibrated" in cost_model.name


def test_a_point_leaves_the_engine_holding_none_of_its_sequences(tmp_path):
    """The scheduler held a cleared point's sequences (its last decode batch, its plain-decode calendar) until the next
    point's first step, timed, which then freed them, every token id of them: the 16-token prefill timed right after
    the full-batch decode point took 4.7 ms on an H100 against 2.1 for 64 tokens, 9.2 against 2.4 on an H200. Each
    point now lets go of its own before the next is timed: none of its sequences is referenced by the engine."""
    import sys

    from engine.llm import LLM
    from sim.profile import GridPoint, StateInjector, measure_once

    save_tiny_qwen3(tmp_path / "model", max_position_embeddings=4096)
    llm = LLM(str(tmp_path / "model"), load_format="dummy", max_num_seqs=64, max_num_batched_tokens=2048,
              block_size=16, max_model_len=4096, device="cpu")
    added = []

    class Recording(StateInjector):
        def add(self, *args, **kwargs):
            added.append(super().add(*args, **kwargs))
            return added[-1]

    injector = Recording(llm.engine, llm.shape.vocab_size)
    try:
        for point in (GridPoint("decode", decode=(64, 512), sampling="filters"), GridPoint("decode", decode=(4, 512)),
                      GridPoint("prefill", prefill=((0, 16),)),
                      GridPoint("mixed", decode=(48, 512), prefill=((0, 64),)),
                      GridPoint("decode_after_eager", decode=(48, 512), prefill=((0, 256),))):
            added.clear()
            measure_once(llm.engine, injector, point)
            unheld = [object() for _ in added]  # referenced by their list alone, as the sequences must be
            assert [sys.getrefcount(seq) for seq in added] == [sys.getrefcount(obj) for obj in unheld], point
    finally:
        llm.close()
