"""The files of a capacity sweep: capacity.json, capacity.parquet and report.html (see `analysis.capacity.cli`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from analysis.capacity.plan import CapacityRun
from analysis.capacity.report import write_capacity_report
from analysis.stats import round_sig
from engine.core.messages import counted
from sim.files import write_parquet_frame

INT64_MAX = 2**63 - 1


def config_record(run: CapacityRun, index: int) -> dict:
    """The capacity.json object of one configuration."""
    result, econ = run.results[index], run.economics[index]
    return {
        "config_id": f"c{result.index}",
        "label": result.label,
        "options": dataclasses.asdict(result.config),
        "max_qps": result.max_qps,
        "max_qps_kind": result.kind,
        "max_qps_by_seed": {str(seed): qps for seed, qps in result.max_qps_by_seed.items()},
        "max_qps_spread": None if result.spread is None else {"min": result.spread[0], "max": result.spread[1]},
        "max_qps_band": result.band,
        "converged": result.converged,
        "monotone": result.monotone,
        "notes": list(result.all_notes),
        "num_simulations": result.num_simulations,
        "cost_model": run.cost_models[index],
        "slos_ms": {slo.key: slo.limit_ms for slo in run.slos},
        "cost": {
            "usd_per_gpu_hour": econ.usd_per_gpu_hour,
            "num_gpus": econ.num_gpus,
            "output_tokens_per_s": round_sig(econ.output_tokens_per_s),
            "cost_per_million_output_tokens_usd": round_sig(econ.cost_per_million_output_tokens_usd),
        },
        "pareto": {
            "latency_key": run.slos[0].key,
            "latency_ms": econ.pareto_latency_ms,
            "on_front": econ.on_pareto_front,
        },
        "replicas_needed": None if econ.replicas_needed is None else dataclasses.asdict(econ.replicas_needed),
        "searches": [{
            "seed": search.seed, "max_qps": search.max_qps, "kind": search.kind,
            "converged": search.outcome.converged, "monotone": search.outcome.monotone,
            "notes": list(search.outcome.notes),
            "points": [{"iteration": i, **dataclasses.asdict(p)} for i, p in enumerate(search.points)],
            "duration_checks": [dataclasses.asdict(check) for check in search.checks],
        } for search in result.searches],
    }


def point_rows(run: CapacityRun) -> list[dict]:
    """capacity.parquet's rows: one per simulation (each seed's points, then its duration check), nested
    figures flattened."""
    rows = []
    for result, econ in zip(run.results, run.economics):
        # The configuration's --seed (host-speed episodes, band replays) as config_seed: as ``seed`` the stream's
        # seed below overwrote it, so a sweep run with --seed 7 had every row say seed 0.
        options = {("config_seed" if name == "seed" else name): value
                   for name, value in dataclasses.asdict(result.config).items()}
        # The engine takes any top_k (one past the vocabulary keeps every token: off); one past int64 (--top-k 10**21)
        # made the column Int128, which pyarrow cannot read. Written as the largest int64, as off as it (capacity.json
        # keeps it as given).
        if options.get("top_k", 0) > INT64_MAX:
            options["top_k"] = INT64_MAX
        simulations = [(search, i, point) for search in result.searches
                       for i, point in enumerate(search.points + search.checks)]
        for search, iteration, point in simulations:
            record = dataclasses.asdict(point)
            slo_values, latency = record.pop("slo_values_ms"), record.pop("latency_ms")
            stability = record.pop("stability")
            rows.append({
                "config_id": f"c{result.index}", "label": result.label, **options, "max_qps": result.max_qps,
                "max_qps_kind": result.kind, "seed_max_qps": search.max_qps, "iteration": iteration, **record,
                **{f"stability_{key}": value for key, value in stability.items() if key != "stable"},
                "is_max_qps": point.duration_scale == 1.0 and point.qps == search.max_qps,
                # The verdict's statistics (over every measured request, an unfinished one infinitely slow) under
                # their own names: as ``ttft_p90_ms`` the finished requests' p90 below overwrote the SLO's, so a row
                # that missed ttft_p90 could show a ttft_p90_ms under its limit.
                **{f"slo_{key}_ms": value for key, value in slo_values.items()},
                **{f"{metric_key.removesuffix('_ms')}_{stat}_ms": value
                   for metric_key, stats in latency.items() for stat, value in stats.items()},
                "cost_per_million_output_tokens_usd": econ.cost_per_million_output_tokens_usd,
                "on_pareto_front": econ.on_pareto_front,
            })
    return rows


def _shortened_text(run: CapacityRun) -> str:
    """The report's word on streams --max-requests shortened (nothing where none was)."""
    workload = run.workload
    if not any(workload.shortened(p.qps) for r in run.results for s in r.searches for p in (*s.points, *s.checks)):
        return ""
    return (f", at most {workload.max_requests:,} (--max-requests: shorter than {workload.min_duration_s:g} s above "
            f"{workload.shortened_above_qps():.4g} req/s; see the notes)")


def write_outputs(run: CapacityRun, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [config_record(run, i) for i in range(len(run.results))]
    (out_dir / "capacity.json").write_text(json.dumps(records, indent=2) + "\n")
    frame = pl.DataFrame(point_rows(run), infer_schema_length=None)
    frame = frame.with_columns(pl.col(name).cast(pl.Float64)
                               for name, dtype in frame.schema.items() if dtype == pl.Null)
    write_parquet_frame(frame, out_dir / "capacity.parquet")
    slo_text = ", ".join(str(s) for s in run.slos)
    roofline = all(name.startswith("roofline-estimate") for name in run.cost_models)  # a host slowdown follows
    estimate = " (an analytic estimate, not measured)" if roofline else ""
    write_capacity_report(
        out_dir / "report.html", run, title=f"Capacity of {Path(run.trace_path).name} under {slo_text}",
        subtitle=(
            f"{counted(run.num_requests, 'request')} in {counted(run.num_sessions, 'session')} "
            f"(recorded at {run.trace_qps:.4g} req/s), "
            f"resampled into a stream of at least {run.workload.min_duration_s:g} s and "
            f"{run.workload.min_requests} requests at each QPS tried{_shortened_text(run)} "
            f"(think times: {run.workload.think_times}); "
            f"the first {run.workload.warmup_fraction:.0%} is not measured; {len(run.seeds)} seed(s)"
            f"{' (each a band replay: max QPS p5-p95 in capacity.json)' if run.band_replays else ''}; "
            f"{sum(r.num_simulations_run for r in run.results)} simulations; "
            f"cost model: {run.cost_model_text}{estimate}. "
            "Costs use illustrative list prices (edit them below)."
        ),
    )
