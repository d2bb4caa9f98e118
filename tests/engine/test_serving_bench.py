"""benchmarks/serving.py's bisection, on CPU: the GPU replays are stood in for by an engine that meets the SLO up
to a known rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import serving


def _fake_replay(capacities: dict[str, float], calls: list):
    def replay(tree, trace, qps, limit, extra, out, model):
        name = "now" if Path(tree) == serving.REPO else "before"
        calls.append((name, round(qps, 3), limit))
        ttft = 100.0 if qps <= capacities[name] else 5000.0
        return {"qps": round(qps, 3), "wall_s": 0.0, "ttft_ms_p50": ttft / 2, "ttft_ms_p90": ttft,
                "tpot_ms_p50": 10.0, "output_throughput": 1.0, "num_finished": limit}
    return replay


def _run(tmp_path: Path, monkeypatch, capacities: dict[str, float], *options: str) -> tuple[dict, list]:
    """benchmarks/serving.py against a before tree holding an (empty) engine/replay.py and a stand-in trace file,
    its replays stood in for by engines of these capacities: (the JSON it wrote, the replays it asked for)."""
    calls: list = []
    monkeypatch.setattr(serving, "replay", _fake_replay(capacities, calls))
    monkeypatch.setattr(serving, "cuda_available", lambda: True)  # the replays stood in for need no GPU either
    (tmp_path / "before" / "engine").mkdir(parents=True)
    (tmp_path / "before" / "engine" / "replay.py").write_text("")
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"")
    out = tmp_path / "r.json"
    assert serving.main(["--before-tree", str(tmp_path / "before"), "--trace", str(trace), *options,
                         "--json", str(out)]) == 0
    return json.loads(out.read_text()), calls


def test_bisection_brackets_each_engines_capacity_and_the_ratio(tmp_path, monkeypatch):
    result, calls = _run(tmp_path, monkeypatch, {"before": 50.0, "now": 100.0}, "--probes", "6",
                         "--before-range", "20,80", "--now-range", "40,160", "--num-requests", "10",
                         "--warmup-requests", "3")
    # warm-ups at each bracket's top, then the two engines' probes alternated
    assert calls[:2] == [("before", 80.0, 3), ("now", 160.0, 3)]
    assert [c[0] for c in calls[2:]] == ["before", "now"] * 6
    assert calls[2][1] == 40.0 and calls[3][1] == 80.0  # geometric midpoints of the brackets
    for name, capacity in (("before", 50.0), ("now", 100.0)):
        met, missed = result[f"{name}_highest_qps_meeting_slo"], result[f"{name}_lowest_qps_missing_slo"]
        # six halvings of a bracket four times wide (in log): it closes to 4 ** (1 / 64) around the capacity
        assert met <= capacity < missed and missed / met == pytest.approx(4 ** (1 / 64), rel=1e-4)
        assert all(r["met_slo"] == (r["qps"] <= capacity) for r in result["runs"][name])
    assert [r["qps"] for r in result["runs"]["before"]] == [40.0, 56.569, 47.568, 51.874, 49.674, 50.762]
    assert result["ratio_lower_bound"] == round(result["now_highest_qps_meeting_slo"]
                                                / result["before_lowest_qps_missing_slo"], 3)
    assert 1.8 < result["ratio_lower_bound"] <= 2.0


def test_an_engine_that_never_meets_the_slo_has_no_capacity_and_no_ratio(tmp_path, monkeypatch):
    result, _ = _run(tmp_path, monkeypatch, {"before": 50.0, "now": 1.0}, "--probes", "3", "--warmup-requests", "0")
    assert result["now_highest_qps_meeting_slo"] is None and result["ratio_lower_bound"] is None
    # every probe missed: the bracket's top came down three times from 180 towards its bottom, 60
    assert result["now_lowest_qps_missing_slo"] == round(60 * 3 ** (1 / 8), 3)
    assert result["before_highest_qps_meeting_slo"] == round(30 * 4 ** (1 / 4), 3)  # 60 missed, 42.4 met, 50.5 missed
