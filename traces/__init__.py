"""Request traces: one parquet schema, converters from public traces, and a synthesizer.

    from traces import load_trace
    trace = load_trace("traces/sharegpt.parquet").with_qps(4.0)

See traces/README.md for the schema and the command lines.
"""

from traces.errors import TraceError
from traces.schema import Trace, load_trace, save_trace, validate

__all__ = ["Trace", "TraceError", "load_trace", "save_trace", "validate"]
