"""``python -m engine.replay TRACE --model NAME``: the command lives in the application layer, ``cli.engine_replay``."""

if __name__ == "__main__":
    from engine.core.interrupt import run_command

    run_command("cli.engine_replay")  # a Ctrl-C while its imports load is one line, not a traceback
