"""Hostile probe (session 26, J): silent wrong results in capacity planning.

What held up, checked by hand: a point's SLO percentiles equal those of `python -m sim.replay` on the same steady
stream (its measured window, 1 and 2 replicas, lor and rr), the $/1M-token figures and GPU counts (replicas x TP),
the Pareto flags, the median over seeds, replicas needed, the report's table against capacity.json, and
certain-miss stops against full runs. What did not:

- With ``--qps-min 2 --qps-max 20 --max-iterations 1`` only --qps-min was simulated, and the search ended
  saying "capacity is at least 2 req/s (--qps-max met the SLOs); raise --qps-max": --qps-max was never tried.
  Expected: the search ends on its budget and the note says the highest QPS tried met the SLOs, advising to raise
  --max-iterations; "--qps-max met the SLOs" only where --qps-max itself passed.
- capacity.parquet wrote the configuration's options and then the point's fields into one row, and both have a
  ``seed``: the stream's seed overwrote ``--seed``, so a sweep with ``--seed 7`` had every row say seed 0 or 1.
  Expected: ``seed`` stays the stream's, the option is ``config_seed`` (7 on every row).
- capacity.json's configuration-level ``converged`` and ``monotone`` were the median seed's alone, while
  ``max_qps_kind`` is the least certain seed's: a seed whose bracket stayed open and that passed above a failure
  gave ``"max_qps_kind": "bracket"`` beside ``"converged": true, "monotone": true``. Expected: both hold only when
  they hold for every seed's search.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import polars as pl

from analysis.capacity.bisection import CapacitySearch, SearchOutcome, SearchParams
from analysis.capacity.cost import assess
from analysis.capacity.outputs import config_record
from analysis.capacity.sweep import ConfigResult, SeedSearch
from analysis.slo import parse_slos
from sim.config import SimConfig
from tests.analysis.capacity_results import point_result
from tests.sim.helpers import SHAREGPT


def _run(search: CapacitySearch, verdict) -> SearchOutcome:
    while not search.done:
        proposed = search.propose()
        if proposed:
            search.observe({qps: verdict(qps) for qps in proposed})
    return search.outcome()


def test_the_qps_max_note_needs_qps_max_tried() -> None:
    outcome = _run(CapacitySearch(SearchParams(qps_min=2.0, qps_max=20.0, max_iterations=1)), lambda qps: True)
    assert outcome.points == ((2.0, True),) and outcome.max_qps == 2.0 and not outcome.converged
    assert outcome.notes == ("capacity is at least 2 req/s (the highest QPS tried met the SLOs); "
                             "raise --max-iterations",)
    # --qps-max tried and passed: the note names it, as before.
    outcome = _run(CapacitySearch(SearchParams(qps_min=2.0, qps_max=20.0, max_iterations=2)), lambda qps: True)
    assert outcome.points == ((2.0, True), (20.0, True))
    assert outcome.notes == ("capacity is at least 20 req/s (--qps-max met the SLOs); raise --qps-max",)
    # No bound and the budget spent doubling: unchanged.
    outcome = _run(CapacitySearch(SearchParams(start_qps=1.0, max_iterations=3)), lambda qps: True)
    assert outcome.notes == ("capacity is at least 4 req/s (the highest QPS tried met the SLOs); raise "
                             "--max-iterations or set --qps-max",)


def test_the_sweep_keeps_its_seed_option_and_says_what_was_tried(tmp_path) -> None:
    from analysis.capacity.cli import main as capacity_main

    out = tmp_path / "cap"
    assert capacity_main([str(SHAREGPT), "--limit", "200", "--slo", "ttft_p90=2s", "--min-duration-s", "10",
                          "--min-requests", "100", "--qps-min", "2", "--qps-max", "20", "--max-iterations", "1",
                          "--no-duration-check", "--seed", "7", "--seeds", "2", "--jobs", "1", "--quiet",
                          "--out", str(out)]) == 0
    (record,) = json.loads((out / "capacity.json").read_text())
    assert record["options"]["seed"] == 7
    for search in record["searches"]:
        assert [p["qps"] for p in search["points"]] == [2.0]
        assert search["notes"] == ["capacity is at least 2 req/s (the highest QPS tried met the SLOs); raise "
                                   "--max-iterations"]
    frame = pl.read_parquet(out / "capacity.parquet")
    assert frame["seed"].to_list() == [0, 1]  # the streams'
    assert frame["config_seed"].to_list() == [7, 7]  # the --seed option


def test_converged_and_monotone_are_every_seeds() -> None:
    config = SimConfig(model="qwen3-8b", gpu="l40s", cost_model="roofline")

    def search(seed: int, verdicts, max_qps: float, converged: bool, monotone: bool) -> SeedSearch:
        points = tuple(point_result(qps, 100.0) for qps, _ in verdicts)
        check = point_result(max_qps, 100.0)
        return SeedSearch(seed, SearchOutcome(max_qps, tuple(verdicts), converged, monotone), points, (check,))

    closed = search(0, ((10.0, True), (10.4, False)), 10.0, True, True)
    # Seed 1 stopped with an open bracket after a higher load passed above a failure.
    open_bracket = search(1, ((8.0, True), (9.0, False), (12.0, True)), 8.0, False, False)
    median = search(2, ((9.0, True), (9.3, False)), 9.0, True, True)
    result = ConfigResult(0, config, "c0", (closed, open_bracket, median))
    assert result.max_qps == 9.0 and result.median_search is median and result.kind == "bracket"
    assert not result.converged and not result.monotone
    slos = parse_slos("ttft_p90=1s")
    run = SimpleNamespace(results=[result], economics=assess([result], {"l40s": 1.0}, 5.0, "ttft_p90"),
                          cost_models=["roofline"], slos=slos)
    record = config_record(run, 0)
    assert (record["max_qps_kind"], record["converged"], record["monotone"]) == ("bracket", False, False)
    assert [(s["converged"], s["monotone"]) for s in record["searches"]] == [(True, True), (False, False),
                                                                            (True, True)]
    # Every seed converged and monotone: the configuration too.
    together = ConfigResult(0, config, "c0", (closed, median))
    assert together.converged and together.monotone
