"""How much host memory is free, for refusing up front what would not fit (torch-free: the engine and the
simulator both ask)."""

from __future__ import annotations


def host_memory_available() -> int | None:
    """Bytes of host memory the kernel can still give (MemAvailable), or None where /proc/meminfo is not there."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
