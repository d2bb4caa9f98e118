"""The single-run HTML report, and the figure builders and page writer the other tools' reports reuse."""
