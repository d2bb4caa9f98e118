"""The engine behind an OpenAI-compatible HTTP API (``python -m engine.serve``): one engine loop in a thread,
FastAPI routes on the event loop, Prometheus metrics under vLLM's names."""
