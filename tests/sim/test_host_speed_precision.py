"""sim.host_speed's timeline CSV keeps the window starts it extracted (they were rounded to 3 decimals)."""

from __future__ import annotations

import pytest

from sim.host_speed import HostSpeedTimeline


@pytest.mark.parametrize("window_s", [0.0004, 1e-9, 0.1, 2.0, 1e4])
def test_window_starts_round_trip_through_the_csv(tmp_path, window_s):
    """Windows of 0.4 ms were written as start_s 0, 0, 0.001, ...: sim.replay --host-slowdown then refused the file
    ("start_s 0 after 0"), and starts shifted by up to 0.5 ms."""
    starts_s = [w * window_s for w in (0, 1, 2, 3, 999_999)]
    HostSpeedTimeline(starts_s, [1.0, 1.5, 2.0, 1.25, 1.0]).write_csv(tmp_path / "h.csv")
    again = HostSpeedTimeline.load_csv(tmp_path / "h.csv")
    assert again.starts_s == pytest.approx(starts_s, rel=1e-12, abs=0)
    assert again.slowdowns == [1.0, 1.5, 2.0, 1.25, 1.0]


def test_window_starts_stay_readable(tmp_path):
    HostSpeedTimeline([0.0, 0.1, 0.2, 3 * 0.1], [1.0, 1.5, 2.0, 1.25]).write_csv(tmp_path / "h.csv")
    assert (tmp_path / "h.csv").read_text().splitlines() == ["start_s,slowdown", "0.0,1.0", "0.1,1.5", "0.2,2.0",
                                                             "0.3,1.25"]
