"""sim.calibrate: the serving factors are recovered from replays whose step times are known."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.core.records import STEP_COLUMNS
from sim.calibrate import calibrate
from sim.calibrate import main as calibrate_main
from sim.profiled_cost_model import ProfiledCostModel, find_profile, fit_profile

STEP_INT_COLUMNS = [c.name for c in STEP_COLUMNS if c.dtype == "int64"]
PROFILE = find_profile("qwen3-0.6b", "h200")


def _features(num_decode: int, context: int, prefill: int = 0) -> dict:
    return {"num_seqs": num_decode + (1 if prefill else 0), "num_prefill_seqs": 1 if prefill else 0,
            "num_prefill_tokens": prefill, "prefill_context_tokens": 0, "num_decode_seqs": num_decode,
            "decode_context_tokens": num_decode * context, "prefill_attention_pairs": prefill * (prefill + 1) // 2,
            "max_decode_context_tokens": context if num_decode else 0,
            # some decode steps repeat the batch before them, others pay the planning surcharge
            "continues_batch": int(num_decode == 96 and not prefill)}


def _fake_run(path, host: float, decode: float):
    """Eager host-bound steps at ``host`` x the grid; decode steps at ``decode`` x the grid."""
    profile = json.loads(PROFILE.read_text())
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")  # the fit calibrate prices with
    rows = []
    for i, (bs, ctx, prefill) in enumerate([(8, 512, 64), (16, 1024, 128), (4, 256, 32)] * 10
                                           + [(32, 700, 0), (96, 1500, 0)] * 20):
        f = _features(bs, ctx, prefill)
        if prefill:
            floor, gpu = grid.eager_parts(f)
            duration = float(grid.combine(host * floor, gpu))
        else:
            duration = decode * grid.predict(f, host_slowdown=1.0)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": i, "start_s": 0.01 * i,
                     "duration_s": duration})
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay's says: a GPU run
    return path


def test_calibration_recovers_the_factors(tmp_path):
    run = _fake_run(tmp_path / "run", host=1.4, decode=1.1)
    serving = calibrate(json.loads(PROFILE.read_text()), [run])
    assert serving["host_factor"] == pytest.approx(1.4, abs=1e-3)
    assert serving["decode_factor"] == pytest.approx(1.1, abs=1e-3)
    assert serving["num_eager_steps"] == 30 and serving["runs"] == [{"run": "run", "num_steps": 70, "host": None}]
    assert serving["same_host_as_profile"] is None  # neither side recorded its host


def test_calibration_records_whether_the_runs_shared_the_profiles_host(tmp_path):
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    host = {"cpu": "Xeon", "num_cpus": 16, "node": "gpu-a"}
    (run / "summary.json").write_text(json.dumps({"config": {"host": host}}))
    profile = json.loads(PROFILE.read_text())
    assert calibrate({**profile, "host": host}, [run])["same_host_as_profile"] is True
    serving = calibrate({**profile, "host": {**host, "node": "gpu-b"}}, [run])
    assert serving["same_host_as_profile"] is False and serving["runs"][0]["host"] == host


def test_cli_writes_the_profile_and_sim_uses_it(tmp_path):
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=2.0, decode=1.0)
    assert calibrate_main([str(profile), str(run)]) == 0
    model = ProfiledCostModel.load(profile)
    assert model.host_factor == pytest.approx(2.0, abs=1e-3) and model.decode_factor == pytest.approx(1.0, abs=1e-3)
    assert "serving-calibrated" in model.name


def test_cli_errors_name_the_run(tmp_path, capsys):
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    with pytest.raises(SystemExit) as exited:
        calibrate_main([str(profile), str(tmp_path / "nowhere")])
    assert exited.value.code == 2 and "nowhere" in capsys.readouterr().err
    old = tmp_path / "old"
    old.mkdir()
    pq.write_table(pa.table({"duration_s": [0.01]}), old / "steps.parquet")
    # Without a summary.json, a sim.replay folder whose summary was removed was calibrated on as a GPU run.
    with pytest.raises(SystemExit):
        calibrate_main([str(profile), str(old)])
    assert capsys.readouterr().err == (f"error: run folder {old} has no readable summary.json; expected an "
                                       "engine.replay output folder (its summary.json tells a GPU run from a "
                                       "simulation)\n")
    (old / "summary.json").write_text('{"cost_model": "measured"}')
    with pytest.raises(SystemExit):
        calibrate_main([str(profile), str(old)])
    assert "missing columns" in capsys.readouterr().err


def test_cli_refuses_a_run_timed_by_a_client(tmp_path, capsys):
    """An imported vllm bench serve result (or a traces.bench run) has an empty step log: it was refused as
    'missing columns ... (recorded by an older engine?)', which sent the user looking for another engine."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    (run / "summary.json").write_text('{"cost_model": "vllm bench serve (client-side timing)"}')
    with pytest.raises(SystemExit) as exited:
        calibrate_main([str(profile), str(run)])
    assert exited.value.code == 2 and capsys.readouterr().err == (
        f"error: run folder {run} was timed by a client (vllm bench serve (client-side timing)) and logged no "
        "engine steps; calibrate on engine.replay runs\n")
    assert profile.read_bytes() == PROFILE.read_bytes()


@pytest.mark.parametrize(("config", "message"), [
    ({"model": "qwen3-8b", "tensor_parallel_size": 1}, "model qwen3-8b, not the profile's qwen3-0.6b"),
    ({"model": "/models/qwen3-0.6b", "tensor_parallel_size": 2}, "tensor-parallel size 2, not the profile's 1"),
    ({"model": "qwen3-0.6b", "device": "NVIDIA A100-SXM4-80GB"}, "device NVIDIA A100-SXM4-80GB, not the profile's"),
    # The shipped profile's engine runs decode steps ahead; an engine.replay --no-run-ahead run's are longer.
    ({"model": "qwen3-0.6b", "run_ahead": False}, "run-ahead off, not the profile's on"),
])
def test_cli_refuses_runs_of_another_deployment(tmp_path, capsys, config, message):
    """A GPU run of another model, tensor-parallel size, device or run-ahead calibrated the profile to it without a
    word (the factors are clamped to 0.25-4, so nothing looked wrong); the profile is left as it was."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": config}))
    with pytest.raises(SystemExit) as exited:
        calibrate_main([str(profile), str(run)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"error: run folder {run} was recorded with {message}" in err
    assert profile.read_bytes() == PROFILE.read_bytes()
    # the same run recorded for the profile's own deployment (a model directory of that name) calibrates it
    device = json.loads(PROFILE.read_text())["device"]
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {
        "model": "/models/Qwen3-0.6B", "tensor_parallel_size": 1, "device": device}}))
    assert calibrate_main([str(profile), str(run)]) == 0


@pytest.mark.parametrize(("profile_overlap", "run_overlap", "message"), [
    (None, True, "decode attention overlap on, not the profile's off"),  # measured before the option existed
    (True, False, "decode attention overlap off, not the profile's on"),
    (False, True, "decode attention overlap on, not the profile's off"),
])
def test_cli_refuses_runs_with_the_decode_attention_overlap_the_profile_lacks(tmp_path, capsys, profile_overlap,
                                                                              run_overlap, message):
    """Mixed steps of an engine with overlap_decode_attention take less time than a profile measured without it prices
    (and the other way round): calibrating on such a run would spread the difference over every eager step."""
    profile = tmp_path / "p.json"
    data = json.loads(PROFILE.read_text())
    if profile_overlap is not None:
        data["engine_features"]["overlaps_decode_attention"] = profile_overlap
    profile.write_text(json.dumps(data))
    before = profile.read_bytes()
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {
        "model": "qwen3-0.6b", "overlap_decode_attention": run_overlap}}))
    with pytest.raises(SystemExit) as exited:
        calibrate_main([str(profile), str(run)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"error: run folder {run} was recorded with {message}" in err
    assert profile.read_bytes() == before
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {
        "model": "qwen3-0.6b", "overlap_decode_attention": bool(profile_overlap)}}))
    assert calibrate_main([str(profile), str(run)]) == 0


def test_a_steps_real_time_is_its_period_where_the_engine_went_straight_on(tmp_path):
    """The loop's work between two steps (postprocess after the recorded end, taking in arrivals) belongs to the
    step before, as the simulator runs steps back to back; not so where the engine then waited idle, nor across
    replicas."""
    from sim.batch_features import read_steps

    rows = []
    # replica 0: busy, busy, then idle (nothing left) before its last step; replica 1: busy, last
    for replica, step, start, duration, left in [(0, 0, 0.0, 0.004, 2), (0, 1, 0.0041, 0.003, 1),
                                                 (0, 2, 0.0075, 0.002, 0), (0, 3, 0.5, 0.002, 0),
                                                 (1, 0, 0.0, 0.010, 1), (1, 1, 0.0102, 0.005, 0)]:
        f = _features(4, 100)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "replica": replica, "step": step,
                     "num_running": left, "start_s": start, "duration_s": duration})
    rows.reverse()  # the reader orders them itself
    (tmp_path / "run").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "run" / "steps.parquet")
    by_start = sorted(read_steps(tmp_path / "run", periods=True), key=lambda s: (s[2], s[1]))
    assert [round(t, 6) for _, t, _ in by_start] == [0.0041, 0.0102, 0.0034, 0.002, 0.005, 0.002]
    assert sorted(t for _, t, _ in read_steps(tmp_path / "run")) == [0.002, 0.002, 0.003, 0.004, 0.005, 0.010]


def test_loop_gaps_recovers_the_loops_costs(tmp_path):
    """validation/loop_gaps.py: gaps made of known costs per step, sequence, finish and arrival are fitted back; a
    step after which the engine waited idle is not a gap of the loop."""
    import numpy as np

    from validation.loop_gaps import loop_gaps

    rng = np.random.default_rng(0)
    steps, arrivals, t = [], [], 0.0
    for i in range(200):
        seqs, finished, arrive = int(rng.integers(1, 64)), int(rng.integers(0, 3)), int(rng.integers(0, 3))
        duration = 0.004
        idle = i == 100  # nothing left after it: the next step starts when a request arrives, much later
        steps.append({"replica": 0, "step": i, "start_s": t, "duration_s": duration, "num_running": 0 if idle else 5,
                      "num_waiting": 0, "num_seqs": seqs, "num_finished": finished})
        gap = 0.5 if idle else 20e-6 + 2e-6 * seqs + 30e-6 * finished + 50e-6 * arrive
        arrivals += [t + duration + gap * (k + 1) / (arrive + 2) for k in range(arrive)]  # between the two starts
        t += duration + gap
    (tmp_path / "run").mkdir()
    pq.write_table(pa.Table.from_pylist(steps), tmp_path / "run" / "steps.parquet")
    pq.write_table(pa.table({"arrival_s": arrivals}), tmp_path / "run" / "requests.parquet")
    fit = loop_gaps(tmp_path / "run")
    assert fit["gaps"] == 198  # 199 pairs, less the idle one
    assert [round(fit[k], 3) for k in ("fixed_us", "per_seq_us", "per_finish_us", "per_arrival_us")] == \
        [20.0, 2.0, 30.0, 50.0]


def test_step_errors_splits_classes_by_batch_size(tmp_path):
    """validation/step_errors.py --batch-bin: each class's steps split by batch size, the bins' counts and times
    adding up to the class's, and a bin's ratio the model's prediction over the real time of its steps."""
    from sim.profiled_cost_model import ProfiledCostModel, find_profile
    from validation.step_errors import step_errors

    rows = []
    t = 0.0
    for step, (seqs, real_s) in enumerate([(4, 0.003), (40, 0.005), (45, 0.006), (4, 0.002)]):
        f = _features(seqs, 100 * seqs)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "replica": 0, "step": step, "num_running": 1,
                     "continues_batch": 0, "start_s": t, "duration_s": real_s})
        t += real_s
    (tmp_path / "run").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "run" / "steps.parquet")
    model = ProfiledCostModel.load(find_profile("qwen3-0.6b", "h200"))
    whole = {r["steps"]: r for r in step_errors(tmp_path / "run", model)}
    binned = {r["steps"]: r for r in step_errors(tmp_path / "run", model, batch_bin=32)}
    assert list(binned) == ["decode, new batch, 0-31 seqs", "decode, new batch, 32-63 seqs", "all"]
    assert [binned[k]["count"] for k in binned] == [2, 2, 4]
    assert binned["all"] == whole["all"]
    assert round(binned["decode, new batch, 0-31 seqs"]["real_ms"], 6) == 2.5
    low = sum(model.predict(_features(4, 400)) for _ in range(2)) / 0.005
    assert binned["decode, new batch, 0-31 seqs"]["predicted_over_real"] == pytest.approx(low)
    # by mean decode context too (400, 4,000, 4,500 and 400 tokens), alone and with the batch bins
    by_context = {r["steps"]: r["count"] for r in step_errors(tmp_path / "run", model, context_bin=1000)}
    assert by_context == {"decode, new batch, mean context 0-999": 2, "decode, new batch, mean context 4000-4999": 2,
                          "all": 4}
    both = {r["steps"]: r["count"] for r in step_errors(tmp_path / "run", model, batch_bin=32, context_bin=1000)}
    assert both == {"decode, new batch, 0-31 seqs, mean context 0-999": 2,
                    "decode, new batch, 32-63 seqs, mean context 4000-4999": 2, "all": 4}


def test_step_errors_prices_the_sampling_a_run_recorded(tmp_path, capsys):
    """validation/step_errors.py prices a run whose summary.json records top-k / top-p with the profile's filtered
    sampling (as sim.replay prices it; priced as greedy, a sampled run read ~0.72 of its real time), names the mode
    in the run's label, and prices a run that records no temperature as greedy; a config the simulator refuses is one
    line naming the file."""
    from sim.profiled_cost_model import ProfiledCostModel, find_profile
    from validation.step_errors import main as step_errors_main
    from validation.step_errors import run_sampling

    rows, t = [], 0.0
    for step in range(3):
        f = _features(64, 64 * 500)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "replica": 0, "step": step, "num_running": 64,
                     "continues_batch": int(step > 0), "start_s": t, "duration_s": 0.006})
        t += 0.006
    for name, config in (("sampled", {"model": "qwen3-0.6b", "temperature": 0.6, "top_k": 20, "top_p": 0.95}),
                         ("greedy", {"model": "qwen3-0.6b"})):
        (tmp_path / name).mkdir()
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / name / "steps.parquet")
        (tmp_path / name / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": config}))
    assert run_sampling(tmp_path / "sampled") == "filters" and run_sampling(tmp_path / "greedy") == "greedy"
    assert step_errors_main([str(tmp_path / "sampled"), str(tmp_path / "greedy")]) == 0
    lines = {line.split()[0] + (" " + line.split()[1] if line.split()[1].startswith("(") else ""): line
             for line in capsys.readouterr().out.splitlines()[1:] if " all " in line}
    path = find_profile("qwen3-0.6b", "h200")
    filters, greedy = ProfiledCostModel.load(path, sampling="filters"), ProfiledCostModel.load(path)
    assert filters.sampling_s(64) > 0.001  # what the test tells apart: the profile measured filters at 64 rows
    for label, model in (("sampled (filters)", filters), ("greedy", greedy)):
        predicted_ms = 1e3 * sum(model.predict({**_features(64, 64 * 500), "continues_batch": int(k > 0)})
                                 for k in range(3)) / 3
        assert float(lines[label].split()[-2]) == pytest.approx(predicted_ms, abs=0.006)
    bad_config = {"cost_model": "measured", "config": {"model": "qwen3-0.6b", "temperature": -1}}
    (tmp_path / "sampled" / "summary.json").write_text(json.dumps(bad_config))
    with pytest.raises(SystemExit) as exit_info:
        step_errors_main([str(tmp_path / "sampled")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "summary.json: config:" in err and "temperature" in err


def test_step_errors_bucket_fit_recovers_a_constant_per_step(tmp_path, capsys):
    """validation/step_errors.py --bucket-fit: steps of 9-16 sequences taking the grid's bucket-16 line less 0.2 ms
    fit back to that intercept less 0.2 ms and the grid's slope; steps that change their batch are left out."""
    from sim.profiled_cost_model import ProfiledCostModel, find_profile, fit_profile
    from validation.step_errors import main as step_errors_main

    profile = json.loads(find_profile("qwen3-0.6b", "h200").read_text())
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    a_s, b_s = grid._decode_a[16], grid._decode_b[16]
    rows, t = [], 0.0
    for step in range(120):
        seqs, context = 9 + step % 8, 200 + 37 * step
        f = {**_features(seqs, context), "continues_batch": int(step % 10 != 0)}
        real_s = a_s + b_s * seqs * context - 2e-4 + (0.01 if step % 10 == 0 else 0.0)  # new batches: off the line
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "replica": 0, "step": step, "num_running": seqs,
                     "start_s": t, "duration_s": real_s})
        t += real_s
    (tmp_path / "run").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "run" / "steps.parquet")
    (tmp_path / "run" / "summary.json").write_text('{"cost_model": "measured"}\n')  # as engine.replay's: a GPU run
    assert step_errors_main([str(tmp_path / "run"), "--bucket-fit"]) == 0
    header, line = capsys.readouterr().out.splitlines()
    bucket, count, real_a, grid_a, real_b, grid_b = line.split()[:6]
    assert (int(bucket), int(count)) == (16, 108)
    assert float(real_a) == pytest.approx(1e3 * a_s - 0.2, abs=1e-3) and float(grid_a) == pytest.approx(1e3 * a_s,
                                                                                                         abs=1e-3)
    assert float(real_b) == pytest.approx(1e9 * b_s, abs=0.1) and float(grid_b) == pytest.approx(1e9 * b_s, abs=0.1)


def test_cli_warns_when_the_eager_steps_are_device_bound(tmp_path, capsys):
    """qwen3-8b's long prefills are device-bound: a host factor fitted to them measures the device part's error."""
    source = find_profile("qwen3-8b", "h200")
    profile = tmp_path / "p8b.json"
    shutil.copy(source, profile)
    grid = ProfiledCostModel(fit_profile({**json.loads(source.read_text()), "serving": None}), "grid")
    rows = []
    for i, (bs, ctx, prefill) in enumerate([(8, 1024, 4096), (32, 2048, 2048)] * 15 + [(32, 700, 0)] * 20):
        f = _features(bs, ctx, prefill)
        floor, gpu = grid.eager_parts(f) if prefill else (0.0, 0.0)
        duration = float(grid.combine(floor, 0.9 * gpu)) if prefill else grid.predict(f, host_slowdown=1.0)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": i, "start_s": 0.1 * i,
                     "duration_s": duration})
    (tmp_path / "run").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "run" / "steps.parquet")
    (tmp_path / "run" / "summary.json").write_text('{"cost_model": "measured"}')
    assert calibrate_main([str(profile), str(tmp_path / "run")]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert serving["eager_host_share"] < 0.25 and serving["host_factor"] < 0.9  # the device's 10 % taken as host
    assert "warning: the eager steps are device-bound" in capsys.readouterr().out
    shared = tmp_path / "p06.json"  # the small prefills of the 0.6b fake run are host-bound: no warning
    shutil.copy(PROFILE, shared)
    assert calibrate_main([str(shared), str(_fake_run(tmp_path / "run06", host=1.2, decode=1.0))]) == 0
    assert json.loads(shared.read_text())["serving"]["eager_host_share"] >= 0.25
    assert "warning" not in capsys.readouterr().out


def _mixed_run(path, host: float, device: float, shapes=None):
    """Eager steps at ``host`` x the grid's host part plus ``device`` x its device time: short prompts among few
    decode rows (host-bound) and 2k-8k-token chunks (device-bound), as Azure's and Mooncake's slices together."""
    profile = json.loads(PROFILE.read_text())
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    rows = []
    shapes = shapes or [(8, 512, 64), (16, 1024, 128), (4, 256, 32), (2, 300, 8192), (1, 200, 4096), (8, 900, 2048)]
    for i, (bs, ctx, prefill) in enumerate(shapes * 10 + [(32, 700, 0)] * 20):
        f = _features(bs, ctx, prefill)
        if prefill:
            floor, gpu = grid.eager_parts(f)
            duration = float(grid.combine(host * floor, device * gpu))
        else:
            duration = grid.predict(f, host_slowdown=1.0)
        rows.append({**{c: f.get(c, 0) for c in STEP_INT_COLUMNS}, "step": i, "start_s": 0.05 * i,
                     "duration_s": duration})
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), path / "steps.parquet")
    (path / "summary.json").write_text('{"cost_model": "measured"}\n')
    return path


def test_host_and_device_factors_are_both_recovered_from_short_and_long_prompts(tmp_path, capsys):
    """A machine whose host is 30 % slower than the grid's and whose eager device time is 8 % shorter: one host
    factor alone would price the short prompts too slow or the long ones too fast."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _mixed_run(tmp_path / "run", host=1.3, device=0.92)
    assert calibrate_main([str(profile), str(run)]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert serving["host_factor"] == pytest.approx(1.3, abs=1e-3)
    assert serving["device_factor"] == pytest.approx(0.92, abs=1e-3)
    assert serving["eager_host_share_spread"] >= 0.2
    assert "device factor 0.92" in capsys.readouterr().out
    model = ProfiledCostModel.load(profile)
    assert "host x1.30, device x0.92" in model.name
    grid = ProfiledCostModel(fit_profile({**json.loads(PROFILE.read_text()), "serving": None}), "grid")
    for bs, ctx, prefill in [(8, 512, 64), (2, 300, 8192)]:
        f = _features(bs, ctx, prefill)
        floor, gpu = grid.eager_parts(f)
        assert model.predict(f) == pytest.approx(1.3 * floor + 0.92 * gpu, rel=1e-3)
        # a host slowdown moves the host part only: the GPU does not follow the host's speed
        assert model.predict(f, host_slowdown=2.0) == pytest.approx(2.0 * floor + 0.92 * gpu, rel=1e-3)
    decode = _features(32, 700)
    assert model.predict(decode) == pytest.approx(grid.predict(decode, host_slowdown=1.0) * model.decode_factor)


def test_runs_of_one_prompt_shape_fit_the_host_factor_alone(tmp_path, capsys):
    """Steps whose host shares hardly differ cannot tell the host's error from the device's: device factor 1, and the
    host factor matches the eager steps' total as before."""
    run = _mixed_run(tmp_path / "run", host=1.3, device=0.92, shapes=[(8, 512, 64), (16, 1024, 128)])
    serving = calibrate(json.loads(PROFILE.read_text()), [run])
    assert serving["device_factor"] == 1.0 and serving["eager_host_share_spread"] < 0.2
    profile = json.loads(PROFILE.read_text())
    grid = ProfiledCostModel(fit_profile({**profile, "serving": None}), "grid")
    steps = [_features(8, 512, 64), _features(16, 1024, 128)]
    real = sum(grid.combine(1.3 * a, 0.92 * b) for a, b in map(grid.eager_parts, steps))
    priced = sum(grid.combine(serving["host_factor"] * a, b) for a, b in map(grid.eager_parts, steps))
    assert priced == pytest.approx(real, rel=1e-4)  # the factor is written to 4 decimals
    profile_path = tmp_path / "p.json"
    shutil.copy(PROFILE, profile_path)
    assert calibrate_main([str(profile_path), str(run)]) == 0
    assert "no device factor: the eager steps' host shares spread" in capsys.readouterr().out


@pytest.mark.parametrize("config, named", [
    ({"temperature": 0.6, "top_k": 20, "top_p": 0.95}, "temperature 0.6, top_k 20, top_p 0.95"),
    ({"temperature": 1.0}, "temperature 1.0"),
])
def test_cli_refuses_a_run_whose_requests_sampled(tmp_path, capsys, config, named):
    """An engine.replay --temperature run's steps took what the sampler adds: fitted into the serving factors, every
    greedy replay would have been priced long (sim.replay prices sampling apart, as the profile measured it)."""
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    run = _fake_run(tmp_path / "run", host=1.0, decode=1.0)
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": config}))
    with pytest.raises(SystemExit) as exited:
        calibrate_main([str(profile), str(run)])
    assert exited.value.code == 2 and capsys.readouterr().err == (
        f"error: run folder {run} sampled its requests ({named}); calibrate on greedy engine.replay runs (no "
        "--temperature): the serving factors scale greedy steps, and sim.replay adds what sampling costs as the "
        "profile measured it\n")
    assert profile.read_bytes() == PROFILE.read_bytes()
    (run / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": {"temperature": 0.0}}))
    assert calibrate_main([str(profile), str(run)]) == 0  # greedy: calibrated as before
