"""``python -m traces.bench URL TRACE``: the command lives in the application layer, ``cli.traces_bench``."""

if __name__ == "__main__":
    import sys

    from cli.traces_bench import main

    sys.exit(main())
