"""``python -m engine.serve --model NAME``: the command lives in the application layer, ``cli.engine_serve``."""

if __name__ == "__main__":
    from engine.core.interrupt import run_command

    run_command("cli.engine_serve")  # a Ctrl-C while its imports load is one line, not a traceback
