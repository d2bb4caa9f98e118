"""Finish a replay folder: latency columns, summary.json and optionally report.html.

``python -m analysis.summarize DIR`` — for GPU replays written where polars is missing; the folder
must hold requests.parquet and steps.parquet, and run.json (config and cost model) if present.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polars as pl

from analysis.metrics import add_latency_columns, summarize
from analysis.report.summary_table import format_summary_table


def summarize_run_dir(run_dir: Path, report: bool = False, title: str | None = None) -> dict:
    run_dir = Path(run_dir)
    for name in ("requests.parquet", "steps.parquet"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} does not exist")
    requests = pl.read_parquet(run_dir / "requests.parquet")
    if "ttft_s" not in requests.columns:
        requests = add_latency_columns(requests).sort("arrival_s", "request_id", maintain_order=True)
        requests.write_parquet(run_dir / "requests.parquet")
    steps = pl.read_parquet(run_dir / "steps.parquet")
    summary = summarize(requests, steps)
    run_file = run_dir / "run.json"
    if run_file.is_file():
        summary.update(json.loads(run_file.read_text()))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if report:
        from analysis.report.replay_report import write_report

        config = summary.get("config", {})
        write_report(requests, steps, summary, run_dir / "report.html",
                     title=title or f"Replay of {Path(str(config.get('trace', run_dir.name))).name}",
                     subtitle=f"{config.get('model', '')} on {config.get('device', '')}; cost model: {summary.get('cost_model', '')}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.summarize", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="+", help="replay output folder(s)")
    parser.add_argument("--report", action="store_true", help="also write report.html")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    for run_dir in args.run_dir:
        try:
            summary = summarize_run_dir(Path(run_dir), report=args.report)
        except (FileNotFoundError, OSError, pl.exceptions.PolarsError) as exc:
            parser.exit(2, f"error: {exc}\n")
        if not args.quiet:
            print(f"{run_dir}:\n{format_summary_table(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
