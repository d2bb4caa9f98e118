"""Where the step loop reads time: the wall clock on hardware, simulated time in the simulator."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class WallClock:
    """Seconds since this clock was created (or last reset)."""

    def __init__(self) -> None:
        self._origin = time.perf_counter()

    def reset(self) -> None:
        self._origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._origin

    def sleep_until(self, t_s: float) -> None:
        delay = t_s - self.now()
        if delay > 0:
            time.sleep(delay)
