"""Sim-vs-real comparison of two replay folders: ``python -m analysis.compare REAL_DIR SIM_DIR``."""
