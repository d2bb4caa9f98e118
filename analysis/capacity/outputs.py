"""The files of a capacity sweep: capacity.json, capacity.parquet and report.html (see `analysis.capacity.cli`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl

from analysis.capacity.plan import CapacityRun
from analysis.capacity.report import write_capacity_report
from analysis.stats import round_sig


def config_record(run: CapacityRun, index: int) -> dict:
    """The capacity.json object of one configuration."""
    result, econ = run.results[index], run.economics[index]
    return {
        "config_id": f"c{result.index}",
        "label": result.label,
        "options": dataclasses.asdict(result.config),
        "max_qps": result.max_qps,
        "converged": result.outcome.converged,
        "monotone": result.outcome.monotone,
        "notes": list(result.outcome.notes),
        "num_simulations": len(result.points),
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
        "points": [{"iteration": i, **dataclasses.asdict(p)} for i, p in enumerate(result.points)],
    }


def point_rows(run: CapacityRun) -> list[dict]:
    """capacity.parquet's rows: one per (configuration, QPS tried), nested figures flattened."""
    rows = []
    for result, econ in zip(run.results, run.economics):
        options = dataclasses.asdict(result.config)
        for iteration, point in enumerate(result.points):
            record = dataclasses.asdict(point)
            slo_values, latency = record.pop("slo_values_ms"), record.pop("latency_ms")
            rows.append({
                "config_id": f"c{result.index}", "label": result.label, **options, "max_qps": result.max_qps,
                "iteration": iteration, **record,
                "is_max_qps": result.max_qps is not None and point.qps == result.max_qps,
                **{f"{key}_ms": value for key, value in slo_values.items()},
                **{f"{metric_key.removesuffix('_ms')}_{stat}_ms": value
                   for metric_key, stats in latency.items() for stat, value in stats.items()},
                "cost_per_million_output_tokens_usd": econ.cost_per_million_output_tokens_usd,
                "on_pareto_front": econ.on_pareto_front,
            })
    return rows


def write_outputs(run: CapacityRun, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    records = [config_record(run, i) for i in range(len(run.results))]
    (out_dir / "capacity.json").write_text(json.dumps(records, indent=2) + "\n")
    frame = pl.DataFrame(point_rows(run), infer_schema_length=None)
    frame = frame.with_columns(pl.col(name).cast(pl.Float64)
                               for name, dtype in frame.schema.items() if dtype == pl.Null)
    frame.write_parquet(out_dir / "capacity.parquet")
    slo_text = ", ".join(str(s) for s in run.slos)
    estimate = " (an analytic estimate, not measured)" if set(run.cost_models) == {"roofline-estimate"} else ""
    write_capacity_report(
        out_dir / "report.html", run, title=f"Capacity of {Path(run.trace_path).name} under {slo_text}",
        subtitle=(
            f"{run.num_requests} requests (recorded at {run.trace_qps:.4g} req/s), rescaled to each QPS tried; "
            f"{sum(len(r.points) for r in run.results)} simulations; cost model: {run.cost_model_text}{estimate}. "
            "Costs use illustrative list prices (edit them below)."
        ),
    )
