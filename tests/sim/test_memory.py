"""The simulator's allocator settings (sim.memory) take effect where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from sim.memory import return_freed_memory_promptly


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_settings() -> None:
    assert return_freed_memory_promptly() is True  # mallopt accepted both (it returns 0 for a refused one)
