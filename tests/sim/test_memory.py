"""The simulator's allocator settings (sim.memory) take effect where glibc is the allocator."""

from __future__ import annotations

import platform

import pytest

from sim.memory import return_freed_memory_promptly


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_glibc_accepts_the_settings() -> None:
    assert return_freed_memory_promptly() is True  # mallopt accepted both (it returns 0 for a refused one)


def _mallinfo() -> tuple[int, int] | None:
    """glibc's count of blocks mapped on their own and the free bytes its heaps hold (mallinfo2's hblks and
    fordblks), or None before glibc 2.33."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return info.hblks, info.fordblks


def _maps_a_block_larger_than_the_heaps_free_bytes():
    """Whether a block larger than every free byte the heaps hold gets a mapping of its own (True) or comes
    from the heap grown (False), with the block kept alive; None before glibc 2.33 or where the heaps hold so
    much free that the block would pass the largest threshold. glibc serves any block from a free chunk large
    enough before it considers a mapping, so the block must exceed them all: earlier tests leave the heap in
    any state (a fixed 1.6 MB block came from a chunk left free on CI)."""
    import numpy as np

    info = _mallinfo()
    if info is None:
        return None, None
    blocks, free_bytes = info
    size_bytes = free_bytes + 2**20
    if size_bytes >= 30 * 2**20:
        return None, None
    block = np.empty(size_bytes, dtype=np.uint8)
    return _mallinfo()[0] == blocks + 1, block


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_reusing_freed_memory_restores_the_prompt_settings_and_changes_no_result():
    import numpy as np

    from sim.memory import reusing_freed_memory

    return_freed_memory_promptly()
    with reusing_freed_memory():
        total = float(np.arange(4_000_000, dtype=np.float64).sum())  # 32 MB, from the heap within
        blocks_inside = _mallinfo()
        held_inside = np.empty(16 * 2**20, dtype=np.uint8)  # from the heap: below the 32 MiB threshold within
        mapped_inside = None if blocks_inside is None else _mallinfo()[0] == blocks_inside[0] + 1
    mapped_after, held_after = _maps_a_block_larger_than_the_heaps_free_bytes()
    assert total == float(np.arange(4_000_000, dtype=np.float64).sum())
    assert return_freed_memory_promptly() is True
    if mapped_after is None:
        pytest.skip("no mallinfo2 (glibc before 2.33), or the heaps hold too much free to test with")
    assert mapped_inside is False  # within: from the heap
    assert mapped_after is True  # the prompt settings again: a block this large gets its own mapping
    del held_inside, held_after
