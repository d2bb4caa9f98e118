"""sim.calibrate --add: several machine sessions, priced at their mean, and band replays drawn across them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sim.bands import band_model, replay_setup
from sim.calibrate import main as calibrate_main
from sim.config import SimConfig
from sim.profiled_cost_model import ProfiledCostModel
from tests.sim.test_calibrate import PROFILE, _fake_run


def _calibrated(tmp_path, sessions: list[tuple[float, float]]):
    """A copy of the profile calibrated on one fake run per (host, decode) session, the first without --add."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "p.json"
    shutil.copy(PROFILE, profile)
    for i, (host, decode) in enumerate(sessions):
        run = _fake_run(tmp_path / f"run{i}", host=host, decode=decode)
        assert calibrate_main([str(profile), str(run), *(["--add"] if i else [])]) == 0
    return profile


def test_sessions_are_kept_and_priced_at_their_mean(tmp_path, capsys):
    profile = _calibrated(tmp_path, [(0.8, 0.97), (1.0, 1.02)])
    serving = json.loads(profile.read_text())["serving"]
    assert [s["host_factor"] for s in serving["sessions"]] == pytest.approx([0.8, 1.0], abs=1e-3)
    assert [s["decode_factor"] for s in serving["sessions"]] == pytest.approx([0.97, 1.02], abs=1e-3)
    assert serving["host_factor"] == pytest.approx(0.9, abs=1e-3)
    assert serving["decode_factor"] == pytest.approx(0.995, abs=1e-3)
    assert serving["host_factor_range"] == pytest.approx([0.8, 1.0], abs=1e-3)
    assert serving["host_share"] == pytest.approx(0.25, abs=0.01)  # decode rose 0.05 while the host rose 0.2
    assert [r["run"] for r in serving["runs"]] == ["run0", "run1"] and serving["num_eager_steps"] == 60
    assert "sessions" not in serving["sessions"][0]  # the first session, as a plain calibration wrote it
    assert "2 machine sessions" in capsys.readouterr().out
    model = ProfiledCostModel.load(profile)
    assert model.host_factor == serving["host_factor"] and model.decode_factor == serving["decode_factor"]
    assert model.host_share == serving["host_share"]
    assert "2 machine sessions" in model.name
    # A third session is added to the two, not to their merge.
    profile = _calibrated(tmp_path / "three", [(0.8, 0.97), (1.0, 1.02), (1.2, 1.07)])
    serving = json.loads(profile.read_text())["serving"]
    assert len(serving["sessions"]) == 3 and serving["host_factor"] == pytest.approx(1.0, abs=1e-3)


def test_a_plain_calibration_replaces_the_sessions(tmp_path):
    profile = _calibrated(tmp_path, [(0.8, 0.97), (1.0, 1.02)])
    run = _fake_run(tmp_path / "again", host=1.3, decode=1.1)
    assert calibrate_main([str(profile), str(run)]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert "sessions" not in serving and serving["host_factor"] == pytest.approx(1.3, abs=1e-3)


def _replay_means(config: SimConfig, profile, num_replays: int = 40) -> list[float]:
    """Each band replay's mean host slowdown: its episodes' normal speed scaled back by the share range's middle."""
    bands = band_model(config, config.model_shape)
    base = ProfiledCostModel.load(profile)
    share_mid = sum(bands.slow_share_range) / 2
    means = []
    for index in range(num_replays):
        normal = float(replay_setup(config, base, bands, index)[0].host_slowdown.split(":")[1].split(",")[0])
        means.append(normal * (1 + share_mid * (bands.slow_over_normal - 1)))
    return means


def _session_hosts(profile) -> list[float]:
    return [s["host_factor"] for s in json.loads(profile.read_text())["serving"]["sessions"]]


def test_band_replays_take_their_machine_from_the_sessions_own_host_factors(tmp_path):
    """Each replay's mean host slowdown is one calibrated session's factor, every session taken: drawn uniformly over
    the sessions' range instead, the band was centred on the range's middle (0.925 here), not on the mean the main
    run uses (0.9), and most replays ran on hosts no session showed."""
    profile = _calibrated(tmp_path, [(0.8, 0.97), (0.85, 0.98), (1.05, 1.03)])
    hosts = _session_hosts(profile)
    config = SimConfig(cost_model=str(profile))
    bands = band_model(config, config.model_shape)
    assert bands.machine_host_factors == tuple(hosts)
    assert bands.mean_slowdown == json.loads(profile.read_text())["serving"]["host_factor"] == \
        pytest.approx(np.mean(hosts), abs=1e-4)  # the main run's: the mean of what the replays draw
    assert bands.describe()["host_speed"].endswith(
        f"the 3 calibrated machine sessions' host factors ({hosts[0]:g}, {hosts[1]:g}, {hosts[2]:g})")
    means = _replay_means(config, profile)
    drawn = [min(hosts, key=lambda h: abs(h - mean)) for mean in means]
    assert means == pytest.approx(drawn, rel=1e-5)  # a session's factor, as the episodes spec writes it (6 digits)
    assert set(drawn) == set(hosts)  # every session is drawn
    # The same replay index draws the same machine (a band is a function of --seed and the index only); another
    # seed, other draws.
    assert _replay_means(config, profile) == means
    assert _replay_means(SimConfig(cost_model=str(profile), seed=1), profile) != means


def test_a_session_that_measured_no_host_factor_is_not_drawn(tmp_path):
    """The replays draw from the sessions the profile's host factor is the mean of: one whose runs had too few eager
    steps carries the grid's unmeasured 1.0, which neither the mean nor the bands count."""
    profile = _calibrated(tmp_path, [(0.8, 0.97), (0.9, 0.98), (1.1, 1.02)])
    data = json.loads(profile.read_text())
    data["serving"]["sessions"][2]["measured"] = ["decode_factor"]
    data["fit"]["serving"] = data["serving"]
    profile.write_text(json.dumps(data))
    config = SimConfig(cost_model=str(profile))
    assert band_model(config, config.model_shape).machine_host_factors == tuple(_session_hosts(profile)[:2])


def test_one_session_or_an_explicit_slowdown_keeps_the_mean_fixed(tmp_path):
    profile = _calibrated(tmp_path, [(0.8, 0.97)])
    config = SimConfig(cost_model=str(profile))
    bands = band_model(config, config.model_shape)
    assert bands.machine_host_factors is None and "a mean slowdown of 0.8" in bands.describe()["host_speed"]
    assert _replay_means(config, profile, 5) == pytest.approx([bands.mean_slowdown] * 5, rel=1e-5)
    profile = _calibrated(tmp_path / "two", [(0.8, 0.97), (1.0, 1.0)])
    config = SimConfig(cost_model=str(profile), host_slowdown="1.1")
    bands = band_model(config, config.model_shape)
    assert bands.machine_host_factors is None and bands.mean_slowdown == 1.1
    assert _replay_means(config, profile, 5) == pytest.approx([1.1] * 5, rel=1e-5)


@pytest.mark.parametrize("field, value", [("host_share", 1.5), ("host_share", -0.1),
                                          ("host_factor_range", [1.0, 0.8]), ("host_factor_range", [0.8]),
                                          ("decode_factor_range", "wide")])
def test_a_bad_session_field_is_an_error_naming_it(tmp_path, field, value):
    profile = _calibrated(tmp_path, [(0.8, 0.97), (1.0, 1.02)])
    data = json.loads(profile.read_text())
    data["serving"][field] = value
    data["fit"]["serving"] = data["serving"]
    profile.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"serving.{field}"):
        ProfiledCostModel.load(profile)


def test_the_same_run_cannot_be_added_as_another_session(tmp_path, capsys):
    profile = _calibrated(tmp_path, [(0.8, 0.97)])
    before = profile.read_bytes()
    with pytest.raises(SystemExit) as exc:
        calibrate_main([str(profile), str(tmp_path / "run0"), "--add"])  # its steps counted as a second machine
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "already holds run run0" in err and err.count("\n") == 1
    assert profile.read_bytes() == before
    (tmp_path / "elsewhere").mkdir()
    again = _fake_run(tmp_path / "elsewhere" / "run0", host=1.0, decode=1.0)  # another machine's run of that name
    other_host = {"host": {"cpu": "x", "num_cpus": 16, "node": "vm"}}
    (again / "summary.json").write_text(json.dumps({"cost_model": "measured", "config": other_host}))
    assert calibrate_main([str(profile), str(again), "--add"]) == 0


def test_sessions_average_their_device_factors_and_older_ones_count_as_1(tmp_path):
    from tests.sim.test_calibrate import _mixed_run

    profile = _calibrated(tmp_path, [(0.8, 0.97)])  # a host-bound fake run: no device factor fitted
    assert json.loads(profile.read_text())["serving"]["device_factor"] == 1.0
    serving = json.loads(profile.read_text())["serving"]
    # as a session calibrated before device factors (and the record of the factors a session measured) existed
    del serving["device_factor"], serving["measured"]
    data = json.loads(profile.read_text())
    data["serving"] = serving
    data["fit"]["serving"] = serving
    profile.write_text(json.dumps(data))
    assert calibrate_main([str(profile), str(_mixed_run(tmp_path / "mixed", host=1.2, device=0.9)), "--add"]) == 0
    serving = json.loads(profile.read_text())["serving"]
    assert [s.get("device_factor") for s in serving["sessions"]] == [None, pytest.approx(0.9, abs=1e-3)]
    assert serving["device_factor"] == pytest.approx(0.95, abs=1e-3)
    assert ProfiledCostModel.load(profile).device_factor == serving["device_factor"]
