"""Metrics and reports over replay tables (simulated or GPU), shared by every CLI.

- `analysis.schema`: the `requests` / `steps` table columns and dtypes
- `analysis.metrics`: vLLM-style latency metrics, `summarize`, goodput
- `analysis.report`: the single-file HTML report and reusable figure builders
"""
