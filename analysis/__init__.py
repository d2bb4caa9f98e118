"""Metrics and reports over replay tables (simulated or GPU), one subpackage per tool.

Shared by every tool (top level):
- `analysis.schema`: the `requests` / `steps` table columns and dtypes
- `analysis.metrics`: vLLM-style latency metrics, `summarize`, per-request SLOs and goodput
- `analysis.slo`: the SLO type (``ttft_p90=2s``) and its statistics
- `analysis.stats`, `analysis.formatting`: distribution statistics; metric labels and number formats
- `analysis.runs`, `analysis.summarize`, `analysis.outdir`: a replay folder's files, default output folders

Tools:
- `analysis.report`: the single-run HTML report, its figure builders and page writer
- `analysis.compare`: sim-vs-real error tables and the step-by-step schedule diff (``python -m analysis.compare``)
- `analysis.capacity`: SLO-bounded capacity sweeps (``python -m analysis.capacity``)
"""

from engine.core.interrupt import quiet_until_main

quiet_until_main()  # under python -m analysis.COMMAND: a Ctrl-C while it imports is one line (engine.core.interrupt)
