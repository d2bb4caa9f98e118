"""Metrics and reports over replay tables (simulated or GPU), shared by every CLI.

- `analysis.schema`: the `requests` / `steps` table columns and dtypes
- `analysis.metrics`: vLLM-style latency metrics, `summarize`, goodput
- `analysis.report` (with `figures`, `html_page`, `downsample`): the single-file HTML report and figure builders
- `analysis.summarize`: summary.json and report for a replay folder (`python -m analysis.summarize DIR`)
- `analysis.compare` (with `compare_*`, `step_diff`): sim-vs-real error tables and the step-by-step schedule diff
- `analysis.capacity` (with `slo`, `bisection`, `sweep`, `capacity_cost`, `capacity_report`): SLO-bounded capacity sweeps
"""
