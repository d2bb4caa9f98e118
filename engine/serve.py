"""``python -m engine.serve --model NAME``: the command lives in the application layer, ``cli.engine_serve``."""

if __name__ == "__main__":
    import sys

    from cli.engine_serve import main

    sys.exit(main())
