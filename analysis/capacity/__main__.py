"""``python -m analysis.capacity``: see `analysis.capacity.cli`."""

if __name__ == "__main__":  # importing this module (as tests/test_layers.py does) must not run the command
    import sys

    from analysis.capacity.cli import main

    sys.exit(main())
