"""Capacity planning by simulation: ``python -m analysis.capacity TRACE --slo ttft_p90=2s,tpot_p90=100ms``."""
