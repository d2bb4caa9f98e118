"""Compare a real (GPU) replay with a simulated one: ``python -m analysis.compare REAL_DIR SIM_DIR``.

Both folders hold requests.parquet, steps.parquet and (optionally) summary.json
as written by `engine.replay` / `sim.replay`. Prints a per-metric table of
signed relative errors (sim - real) / real and writes compare.json, compare.md,
compare.parquet (per-request pairs) and report.html to --out. With --schedule
it also says whether the two runs scheduled the same batches step by step.
Exit codes: 0 done, 1 schedules differ under --require-identical-schedule,
2 unusable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.compare_io import CompareInputError, RunData, load_run
from analysis.compare_metrics import MetricRow, error_table, run_metrics
from analysis.compare_requests import PER_REQUEST_METRICS, RequestJoin, join_requests
from analysis.compare_tables import error_table_markdown, format_error_table, format_fixed_width, format_rel_error
from analysis.step_diff import ScheduleDiff, compare_schedules

__all__ = ["Comparison", "compare_runs", "config_differences", "main", "write_outputs"]

JSON_FILE = "compare.json"
MARKDOWN_FILE = "compare.md"
PARQUET_FILE = "compare.parquet"
REPORT_FILE = "report.html"
EXIT_OK, EXIT_SCHEDULE_DIFFERS, EXIT_BAD_INPUT = 0, 1, 2
# Config keys that differ between any two runs and say nothing about the setup.
_VOLATILE_CONFIG_KEYS = ("simulator_wall_s",)


@dataclass(frozen=True)
class Comparison:
    """Everything computed from one real and one simulated run, before anything is written."""

    real: RunData
    sim: RunData
    real_summary: dict
    sim_summary: dict
    rows: list[MetricRow]
    join: RequestJoin
    schedule: ScheduleDiff
    config_differences: dict[str, dict]

    def to_dict(self) -> dict:
        """The JSON document written to compare.json."""

        def run_entry(run: RunData, summary: dict) -> dict:
            return {"dir": str(run.path), "cost_model": run.cost_model, "trace": run.metadata.get("trace"),
                    "config": run.config, "summary": summary}

        return {
            "real": run_entry(self.real, self.real_summary),
            "sim": run_entry(self.sim, self.sim_summary),
            "relative_error": "(sim - real) / |real|, null when real is 0 or missing",
            "metrics": [row.to_dict() for row in self.rows],
            "requests": self.join.to_dict(),
            "schedule": self.schedule.to_dict(),
            "config_differences": self.config_differences,
        }


def config_differences(real: dict, sim: dict) -> dict[str, dict]:
    """Config keys whose values differ ({key: {"real": ..., "sim": ...}}, None where absent).

    Shown next to the error table because a differing knob (e.g. max_num_seqs)
    explains an error better than any chart.
    """
    keys = sorted(set(real) | set(sim))
    return {
        key: {"real": real.get(key), "sim": sim.get(key)}
        for key in keys
        if key not in _VOLATILE_CONFIG_KEYS and real.get(key) != sim.get(key)
    }


def compare_runs(real: RunData, sim: RunData) -> Comparison:
    """Metrics of both runs through the same code, the per-request join and the schedule diff.

    Raises `CompareInputError` (naming the folders) when the runs cannot be
    paired, e.g. no request ids in common.
    """
    real_summary, real_metrics = run_metrics(real.requests, real.steps)
    sim_summary, sim_metrics = run_metrics(sim.requests, sim.steps)
    join = join_requests(real.requests, sim.requests, real_name=str(real.path), sim_name=str(sim.path))
    try:
        schedule = compare_schedules(real.steps, sim.steps, real.requests, sim.requests)
    except ValueError as exc:
        raise CompareInputError(f"{real.path} vs {sim.path}: {exc}") from exc
    return Comparison(
        real=real,
        sim=sim,
        real_summary=real_summary,
        sim_summary=sim_summary,
        rows=error_table(real_metrics, sim_metrics),
        join=join,
        schedule=schedule,
        config_differences=config_differences(real.config, sim.config),
    )


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def format_request_summary(join: RequestJoin) -> str:
    """Match counts and per-request error percentiles as text lines."""
    header = (
        f"requests matched on request_id: {join.num_matched} of {join.num_real} real "
        f"({_share(join.matched_share_real)}), {join.num_matched} of {join.num_sim} sim "
        f"({_share(join.matched_share_sim)})"
    )
    cells = [("per-request rel. error", "p10", "p50", "p90", "mean |err|", "pairs")]
    stats = join.error_stats()
    for label, key in PER_REQUEST_METRICS:
        entry = stats[key]
        mean_abs = "n/a" if entry["mean_abs"] is None else f"{entry['mean_abs'] * 100:.2f} %"
        cells.append((f"  {label}", *(format_rel_error(entry[name]) for name in ("p10", "p50", "p90")),
                      mean_abs, str(entry["num_pairs"])))
    return header + "\n" + format_fixed_width(cells)


def format_config_differences(differences: dict[str, dict]) -> str:
    """One line listing differing config keys, or "" when the configs agree."""
    if not differences:
        return ""
    items = ", ".join(f"{key} real={values['real']!r} sim={values['sim']!r}" for key, values in differences.items())
    return f"config differences: {items}"


def markdown_document(comparison: Comparison) -> str:
    """compare.md: one context line and the error table, ready to paste into a README."""
    real, sim = comparison.real, comparison.sim
    cost_model = f" (cost model: `{sim.cost_model}`)" if sim.cost_model else ""
    intro = (
        f"Simulation `{sim.name}`{cost_model} vs real `{real.name}`; "
        f"relative error = (sim - real) / real; {comparison.join.num_matched} requests matched.\n\n"
    )
    return intro + error_table_markdown(comparison.rows, real.name, sim.name)


def write_outputs(comparison: Comparison, out_dir: Path, report: bool = True) -> list[Path]:
    """Write compare.json, compare.md, compare.parquet and (unless `report` is False) report.html."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / JSON_FILE, out_dir / MARKDOWN_FILE, out_dir / PARQUET_FILE]
    written[0].write_text(json.dumps(comparison.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    written[1].write_text(markdown_document(comparison), encoding="utf-8")
    comparison.join.frame.write_parquet(written[2])
    if report:
        from analysis.compare_report import write_compare_report

        written.append(
            write_compare_report(comparison.real, comparison.sim, comparison.rows, comparison.join,
                                 comparison.schedule, comparison.config_differences, out_dir / REPORT_FILE)
        )
    return written


def default_out_dir(real_dir: str, sim_dir: str) -> Path:
    """A new folder under runs/ named after both runs, like the replay CLIs' defaults."""
    real_name, sim_name = Path(real_dir).resolve().name, Path(sim_dir).resolve().name
    base = Path("runs") / f"compare-{real_name}-vs-{sim_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, number = base, 1
    while out.exists():
        number += 1
        out = base.with_name(f"{base.name}-{number}")
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.compare",
        description="Compare a real replay with a simulated one: per-metric signed relative errors "
        "(sim - real) / real, per-request pairs, an overlay HTML report and an optional "
        "step-by-step schedule check.",
        epilog="exit codes: 0 done; 1 schedules differ (with --require-identical-schedule); 2 unusable input",
    )
    parser.add_argument("real_dir", metavar="REAL_DIR", help="folder of the real (GPU) replay: requests.parquet, "
                        "steps.parquet and, for context only, summary.json")
    parser.add_argument("sim_dir", metavar="SIM_DIR", help="folder of the simulated replay (same layout)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="output folder for compare.json/.md/.parquet and report.html "
                        "(default: a new folder under runs/)")
    parser.add_argument("--schedule", action="store_true",
                        help="print whether both runs scheduled the same batches step by step "
                        "(or the first differing step)")
    parser.add_argument("--require-identical-schedule", action="store_true",
                        help="like --schedule, and exit with code 1 if the schedules differ")
    parser.add_argument("--no-report", action="store_true", help="skip report.html")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        real = load_run(args.real_dir, "real")
        sim = load_run(args.sim_dir, "sim")
        comparison = compare_runs(real, sim)
    except CompareInputError as exc:
        parser.exit(EXIT_BAD_INPUT, f"error: {exc}\n")
    cost_model = f" (cost model: {sim.cost_model})" if sim.cost_model else ""
    print(f"sim {sim.path}{cost_model} vs real {real.path}; rel. error = (sim - real) / real")
    differences = format_config_differences(comparison.config_differences)
    if differences:
        print(differences)
    print(format_error_table(comparison.rows))
    print(format_request_summary(comparison.join))
    check_schedule = args.schedule or args.require_identical_schedule
    if check_schedule:
        print(comparison.schedule.describe())
    out_dir = Path(args.out) if args.out else default_out_dir(args.real_dir, args.sim_dir)
    try:
        write_outputs(comparison, out_dir, report=not args.no_report)
    except OSError as exc:
        parser.exit(EXIT_BAD_INPUT, f"error: cannot write to {out_dir}: {exc}\n")
    print(f"outputs in {out_dir}/")
    if args.require_identical_schedule and not comparison.schedule.identical:
        return EXIT_SCHEDULE_DIFFERS
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
