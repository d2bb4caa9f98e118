"""The discrete-event simulator: the engine's scheduling core and step loop over a measured cost model."""

import sys

if sys.argv[:1] == ["-m"]:  # python -m sim.COMMAND is importing the package (engine.core.interrupt says why)
    from engine.core.interrupt import quiet_until_main

    quiet_until_main()
