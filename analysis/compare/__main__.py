"""``python -m analysis.compare``: see `analysis.compare.cli`."""

if __name__ == "__main__":  # importing this module (as tests/test_layers.py does) must not run the command
    from analysis.compare.cli import main
    from engine.core.interrupt import exit_when_done

    exit_when_done(main())  # a Ctrl-C or SIGTERM once the outputs are complete leaves the status alone
