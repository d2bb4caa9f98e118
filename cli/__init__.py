"""The application layer: command-line entry points that tie the libraries together.

Library packages (``engine``, ``sim``, ``traces``, ``analysis``) never import this package; the
documented ``python -m sim.replay`` and ``python -m engine.replay`` are three-line shims that call
``cli.sim_replay.main`` and ``cli.engine_replay.main``. ``tests/test_layers.py`` enforces it.
"""
