"""``python -m analysis.report`` is no command: these modules draw the reports the commands write. A replay writes
its own report.html and ``python -m analysis.summarize RUN_DIR --report`` writes it again; Python's own answer here
was "No module named analysis.report.__main__", which named neither."""

if __name__ == "__main__":  # importing this module (as tests/test_layers.py does) must not run the command
    import sys

    sys.stderr.write("error: analysis.report is not a command; write a run folder's report.html with "
                     "python -m analysis.summarize RUN_DIR --report\n")
    sys.exit(2)
