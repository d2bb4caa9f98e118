"""The simulator's allocator settings (sim.memory) take effect where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from sim.memory import return_freed_memory_promptly


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_settings() -> None:
    assert return_freed_memory_promptly() is True  # mallopt accepted both (it returns 0 for a refused one)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_reusing_freed_memory_restores_the_prompt_settings_and_changes_no_result():
    import numpy as np

    from sim.memory import reusing_freed_memory

    with reusing_freed_memory():
        total = float(np.arange(4_000_000, dtype=np.float64).sum())  # 32 MB, from the heap within
    assert total == float(np.arange(4_000_000, dtype=np.float64).sum())
    assert return_freed_memory_promptly() is True
