"""The one writer of a replay folder, simulated or on a GPU, so both lay their folders out alike:

- ``requests.parquet``: one row per request (``engine.core.records``) plus latency columns, by arrival;
- ``steps.parquet``: one row per engine step, per replica;
- ``summary.json``: vLLM-style metrics, then ``cost_model``, ``trace`` and ``config`` of the run;
- ``report.html``: the self-contained Plotly report (unless not asked for).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.metrics import add_latency_columns, summarize


def write_run(
    out_dir: Path,
    requests: pa.Table,
    steps: pa.Table,
    meta: dict,
    *,
    report_title: str | None = None,
    report_subtitle: str = "",
) -> dict:
    """Write the folder; ``meta`` (cost_model, trace, config) follows the metrics in summary.json.
    A report is written when ``report_title`` is given. Returns the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    request_frame = add_latency_columns(pl.from_arrow(requests)).sort("arrival_s", "request_id", maintain_order=True)
    step_frame = pl.from_arrow(steps)
    request_frame.write_parquet(out_dir / "requests.parquet")
    pq.write_table(step_frame.to_arrow(), out_dir / "steps.parquet")
    summary = summarize(request_frame, step_frame)
    summary.update(meta)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if report_title is not None:
        from analysis.report.replay_report import write_report

        write_report(request_frame, step_frame, summary, out_dir / "report.html", title=report_title,
                     subtitle=report_subtitle)
    return summary
