"""The discrete-event simulator: the engine's scheduling core and step loop over a measured cost model."""

from engine.core.interrupt import quiet_until_main

quiet_until_main()  # under python -m sim.COMMAND: a Ctrl-C while it imports is one line (engine.core.interrupt)
