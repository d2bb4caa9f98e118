"""Request traces: one parquet schema, converters from public traces, and a synthesizer.

    from traces import load_trace
    trace = load_trace("traces/sharegpt.parquet").with_qps(4.0)

See traces/README.md for the schema and the command lines.
"""

from engine.core.interrupt import quiet_until_main
from traces.errors import TraceError

quiet_until_main()  # under python -m traces.COMMAND: a Ctrl-C while it imports is one line (engine.core.interrupt)

__all__ = ["Trace", "TraceError", "load_trace", "save_trace", "validate"]

_FROM_SCHEMA = ("Trace", "load_trace", "save_trace", "validate")


def __getattr__(name: str):
    """Trace, load_trace, save_trace and validate, from traces.schema when first asked for: importing it (polars,
    numpy) here ran before any command of the package (python -m traces.bench imports the package first), so a
    Ctrl-C in that half second was a traceback through importlib, not the command's one line."""
    if name in _FROM_SCHEMA:
        from traces import schema

        return getattr(schema, name)
    raise AttributeError(f"module 'traces' has no attribute {name!r}")
