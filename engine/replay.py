"""``python -m engine.replay TRACE --model NAME``: the command lives in the application layer, ``cli.engine_replay``."""

if __name__ == "__main__":
    import sys

    from cli.engine_replay import main

    sys.exit(main())
