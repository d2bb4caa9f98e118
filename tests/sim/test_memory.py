"""The simulator's allocator settings (sim.memory) take effect where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from sim.memory import return_freed_memory_promptly


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_settings() -> None:
    assert return_freed_memory_promptly() is True  # mallopt accepted both (it returns 0 for a refused one)


def _mapped_blocks() -> int | None:
    """glibc's count of blocks mapped on their own (mallinfo2's hblks), or None before glibc 2.33."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    return libc.mallinfo2().hblks


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_reusing_freed_memory_restores_the_prompt_settings_and_changes_no_result():
    import numpy as np

    from sim.memory import reusing_freed_memory

    return_freed_memory_promptly()
    with reusing_freed_memory():
        total = float(np.arange(4_000_000, dtype=np.float64).sum())  # 32 MB, from the heap within
        inside = _mapped_blocks()
        held_inside = np.ones(200_000)  # 1.6 MB: from the heap, not a mapping of its own
        inside_after = _mapped_blocks()
    assert total == float(np.arange(4_000_000, dtype=np.float64).sum())
    assert return_freed_memory_promptly() is True
    before = _mapped_blocks()
    held_after = np.ones(200_000)  # the prompt settings again: a block this large gets its own mapping
    after = _mapped_blocks()
    if before is None:
        pytest.skip("glibc before 2.33 has no mallinfo2 to count mappings with")
    assert inside_after == inside
    assert after == before + 1
    del held_inside, held_after
