"""Probe V (session 27): hostile and inconsistent profiles, and how sim.replay picks and prices with them.

What the probe found:

- A calibration whose decode factor lies below its host factor, both below 1 (host x0.9, decode x0.85: within
  sim.calibrate's bounds), moves decode steps along a line of slope 1.5 through (1, 1), held at 1: ``--host-slowdown
  0.02`` priced them at -0.03x the grid, a simpy "Negative delay" traceback. An explicit ``serving.host_share``
  steeper than decode_factor / host_factor did the same at ordinary slowdowns, and sim.calibrate --add could write
  one. The share is now held at decode_factor / host_factor (the line through the origin: every slowdown > 0
  prices decode steps above zero), a steeper one in a profile is refused naming it, and sim.calibrate writes none.
- ``--cost-model sim/profiles/h200/qwen3-0.6b.json`` with a ``--model`` folder named qwen3-0.6b (or Qwen3-0.6B: the
  profile's model name is matched in any case) holding another model priced that model by the shipped model's step
  times at exit 0, without a warning ('auto' gives such a folder the roofline, saying why); now it is a one-line
  error.
- A profile's fit whose graph sizes were edited apart from the engine options it was measured with (fit.graph_sizes,
  fit.max_graph_batch_size, fit.eager.piecewise_graph_sizes) priced steps as other graphs, 26 % short to 25x long,
  at exit 0; now a one-line error naming the field and the engine option.
- A fit whose coefficients price a step at zero (a decode bucket with intercept and slope 0; an eager fit without
  a term every step has) or serving factors of 1e-300 ran with steps of no time: TTFT and TPOT 0.00 ms, or 266,509
  tokens/s on one H200. Now refused, naming the field.
"""

from __future__ import annotations

import json
import math

import pytest

from cli.sim_replay import main as replay_main
from sim.calibrate import with_sessions
from sim.host_speed import MIN_SLOWDOWN
from sim.profiled_cost_model import _MIN_FACTOR, ProfiledCostModel, _check_serving, find_profile
from tests.sim.helpers import REPO, read_outputs, write_trace
from tests.traces.helpers import cli_error

PROFILE = find_profile("qwen3-0.6b", "h200")
PROFILE_8B = find_profile("qwen3-8b", "h200")
CONFIGS = REPO / "engine" / "configs"


def _profile(tmp_path, change, source=PROFILE, name: str = "p.json"):
    profile = json.loads(source.read_text())
    change(profile)
    path = tmp_path / name
    path.write_text(json.dumps(profile))
    return path


def _calibrated(serving: dict):
    """A change that gives a profile one calibration, in both of its copies."""
    def change(profile: dict) -> None:
        profile["serving"] = dict(serving)
        profile["fit"]["serving"] = dict(serving)
    return change


def _load_error(path) -> str:
    with pytest.raises(ValueError) as caught:
        ProfiledCostModel.load(path)
    return str(caught.value)


def test_a_fast_host_never_prices_decode_steps_below_zero(tmp_path):
    """Host x0.9, decode x0.85, one session (no host_share): the line through (1, 1) has slope 1.5, and at slowdown
    0.02 it gave -0.03x the grid (a 'Negative delay' traceback). The share is held at 0.85 / 0.9."""
    path = _profile(tmp_path, _calibrated({"host_factor": 0.9, "decode_factor": 0.85}))
    model = ProfiledCostModel.load(path)
    assert model.host_share == 0.85 / 0.9
    decode = {"num_seqs": 64, "num_prefill_seqs": 0, "num_prefill_tokens": 0, "prefill_context_tokens": 0,
              "num_decode_seqs": 64, "decode_context_tokens": 64 * 300, "prefill_attention_pairs": 0,
              "max_decode_context_tokens": 300, "continues_batch": 1}
    grid = ProfiledCostModel(model.fit | {"serving": None}, "grid").predict(decode)
    for slowdown in (MIN_SLOWDOWN, 0.02, 0.5, 0.9, 2.0):
        assert model.predict(decode, slowdown) == pytest.approx(0.85 * slowdown / 0.9 * grid, rel=1e-12)
    trace = write_trace(tmp_path / "t.parquet", [200] * 20, [30] * 20, [0.05 * i for i in range(20)])
    out = tmp_path / "run"
    argv = [str(trace), "--cost-model", str(path), "--host-slowdown", "0.02", "--out", str(out), "--no-report",
            "--quiet"]
    assert replay_main(argv) == 0  # was ValueError: Negative delay -0.0002...
    _, steps, summary = read_outputs(out)
    assert steps["duration_s"].min() > 0
    assert all(math.isfinite(summary["ttft_ms"][k]) for k in ("p50", "p99"))


def test_a_host_share_steeper_than_the_origin_is_refused(tmp_path):
    path = _profile(tmp_path, _calibrated({"host_factor": 2.0, "decode_factor": 0.8, "host_share": 0.5}))
    assert _load_error(path) == (
        f"cost model {path}: not a readable profile (field 'serving.host_share' is 0.5; expected at most "
        "serving.decode_factor / serving.host_factor (0.4): a steeper share prices decode steps at or below zero on "
        "a fast host)")  # --host-slowdown 1 priced its decode steps at 0.8 + 0.5 x (1 - 2) = 0.3x, 0.2 at 0.6x...
    ProfiledCostModel.load(_profile(tmp_path, _calibrated({"host_factor": 2.0, "decode_factor": 0.8,
                                                           "host_share": 0.4}), name="q.json"))  # at the bound


def test_calibrate_add_writes_no_share_steeper_than_the_origin():
    """Two sessions whose decode factor rose as much as their host factor (slope 1), at a decode factor half the host
    one: sim.calibrate --add wrote host_share 1, which every replay would price decode steps below zero with."""
    merged = with_sessions({"host_factor": 1.0, "decode_factor": 0.5}, {"host_factor": 1.1, "decode_factor": 0.6})
    assert merged["host_share"] == merged["decode_factor"] / merged["host_factor"] == 0.55 / 1.05
    _check_serving(merged, "serving")  # the cost model takes it


# Qwen3-0.6B: load matches a profile's model name in any case, and the folder's name was compared with the shipped
# configs' in its own case only, so it took the profile at exit 0 after the same name had been refused.
@pytest.mark.parametrize("name", ["qwen3-0.6b", "Qwen3-0.6B"])
def test_an_explicit_profile_of_a_shipped_model_refuses_another_model_of_its_name(tmp_path, capsys, name):
    model = tmp_path / "x" / name
    model.mkdir(parents=True)
    config = json.loads((CONFIGS / "qwen3-0.6b" / "config.json").read_text())
    config.update(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36)
    (model / "config.json").write_text(json.dumps(config))
    trace = write_trace(tmp_path / "t.parquet", [100] * 3, [5] * 3, [0.0, 0.1, 0.2])
    argv = [str(trace), "--model", str(model), "--cost-model", str(PROFILE), "--out", str(tmp_path / "o"),
            "--no-report", "--quiet"]
    assert cli_error(replay_main, argv, capsys) == (
        f"error: cost model {PROFILE} was measured for the shipped model qwen3-0.6b, but --model {model} is another "
        "model of that name (hidden_size 4096, not 1024); profile that model (python -m sim.profile) or use "
        "--cost-model roofline")
    assert not (tmp_path / "o").exists()
    # A copy of the shipped config keeps it.
    (model / "config.json").write_bytes((CONFIGS / "qwen3-0.6b" / "config.json").read_bytes())
    assert replay_main(argv) == 0


SIZES = "[1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, ..."
PIECES = "[16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2304, 2560, 28..."


@pytest.mark.parametrize("change, message", [
    (lambda p: p["fit"].update(graph_sizes=[1, 2, 4, 8]),
     f"field 'fit.graph_sizes' is [1, 2, 4, 8]; expected field 'engine_options.cuda_graph_sizes', {SIZES} (refit it "
     "with python -m sim.fit_profile)"),
    (lambda p: p["fit"].update(graph_sizes=[0]),
     f"field 'fit.graph_sizes' is [0]; expected field 'engine_options.cuda_graph_sizes', {SIZES} (refit it with "
     "python -m sim.fit_profile)"),
    (lambda p: p["fit"].update(max_graph_batch_size=512),
     "field 'fit.max_graph_batch_size' is 512; expected the largest of field 'engine_options.cuda_graph_sizes', 256 "
     "(refit it with python -m sim.fit_profile)"),
    (lambda p: p["fit"]["eager"].update(piecewise_graph_sizes=[8192]),
     f"field 'fit.eager.piecewise_graph_sizes' is [8192]; expected field 'engine_options.piecewise_graph_sizes', "
     f"{PIECES} (refit it with python -m sim.fit_profile)"),
])
def test_a_fit_of_other_graphs_than_the_profile_measured_is_refused(tmp_path, change, message):
    """qwen3-8b: graph_sizes [1, 2, 4, 8] priced a 256-row decode step as an 8-row graph (26 % short),
    max_graph_batch_size 512 a 400-row one as a 256-row graph (half its eager price), piecewise sizes [8192] a
    100-token prefill as 8192 tokens (25x), all at exit 0."""
    path = _profile(tmp_path, change, PROFILE_8B)
    assert _load_error(path) == f"cost model {path}: not a readable profile ({message})"


def _zero_decode(profile: dict) -> None:
    decode = profile["fit"]["graph_decode"]
    decode["intercept_s"][3] = decode["per_kv_token_s"][3] = 0.0


def _zero_eager(profile: dict) -> None:
    eager = profile["fit"]["eager"]
    eager["floor_coef"][:2] = [0.0, 0.0]
    eager["gpu_coef"][0] = 0.0


@pytest.mark.parametrize("change, message", [
    (_zero_decode, "fields 'fit.graph_decode.intercept_s' and 'per_kv_token_s' are both 0 at batch size 8, which "
                   "prices its decode steps at zero; expected one of them > 0"),
    (_zero_eager, "field 'fit.eager' has floor_coef 'one', floor_coef 'num_seqs', gpu_coef 'padded_tokens' all 0, the "
                  "terms every prefill and mixed step has; expected one of them > 0 (a step of one sequence and one "
                  "token takes time)"),
    (_calibrated({"host_factor": 1e-300, "decode_factor": 1.0}),
     "field 'serving.host_factor' is 1e-300; expected a finite number from 0.001 to 1000"),
    (_calibrated({"host_factor": 1.0, "decode_factor": 1e-300}),
     "field 'serving.decode_factor' is 1e-300; expected a finite number from 0.001 to 1000"),
    (_calibrated({"host_factor": 1.0, "decode_factor": 1.0, "host_factor_range": [1e-300, 1.0]}),
     "field 'serving.host_factor_range' is [1e-300, 1.0]; expected [low, high], 0.001 <= low <= high <= 1000"),
])
def test_a_profile_that_prices_steps_at_zero_is_refused(tmp_path, change, message):
    path = _profile(tmp_path, change)
    assert _load_error(path) == f"cost model {path}: not a readable profile ({message})"


def test_the_smallest_factor_is_the_fastest_host_a_replay_takes():
    assert _MIN_FACTOR == MIN_SLOWDOWN
