"""``python -m traces.bench URL TRACE``: the command lives in the application layer, ``cli.traces_bench``."""

if __name__ == "__main__":
    from engine.core.interrupt import run_command

    run_command("cli.traces_bench")  # a Ctrl-C while its imports load is one line, not a traceback
