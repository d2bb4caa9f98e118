"""``python -m analysis.compare``: see `analysis.compare.cli`."""

if __name__ == "__main__":  # importing this module (as tests/test_layers.py does) must not run the command
    import sys

    from analysis.compare.cli import main

    sys.exit(main())
