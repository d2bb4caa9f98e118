"""``python -m sim.replay TRACE``: the command lives in the application layer, ``cli.sim_replay``."""

if __name__ == "__main__":
    import sys

    from cli.sim_replay import main

    sys.exit(main())
