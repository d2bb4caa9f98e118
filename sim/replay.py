"""``python -m sim.replay TRACE``: the command lives in the application layer, ``cli.sim_replay``."""

if __name__ == "__main__":
    from engine.core.interrupt import run_command

    run_command("cli.sim_replay")  # a Ctrl-C while its imports load, or once its outputs are complete: see there
