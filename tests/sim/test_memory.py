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


_READ_NUMPY_HUGEPAGE = (  # numpy's switch returns its previous value: set it back, print what it was
    "from sim.memory import numpy_on_small_pages\n"
    "{call}"
    "try:\n"
    "    from numpy._core.multiarray import _set_madvise_hugepage\n"
    "except ImportError:\n"
    "    from numpy.core.multiarray import _set_madvise_hugepage\n"
    "was = _set_madvise_hugepage(True)\n"
    "_set_madvise_hugepage(was)\n"
    "print(was)\n"
)


@pytest.mark.parametrize(("env", "call", "expected"), [
    # Asked once a simulation starts, or outputs are written: numpy's large arrays no longer ask for huge pages.
    ({}, "from sim.memory import return_freed_memory_promptly\nreturn_freed_memory_promptly()\n", "False"),
    ({}, "from sim.memory import reusing_freed_memory\nwith reusing_freed_memory():\n    pass\n", "False"),
    # The user's own choice stands.
    ({"NUMPY_MADVISE_HUGEPAGE": "1"}, "numpy_on_small_pages()\n", "True"),
], ids=["simulation", "outputs", "user-says-huge-pages"])
def test_numpy_stops_asking_for_huge_pages_unless_the_user_says(env: dict, call: str, expected: str) -> None:
    """Writing the Azure trace's outputs took ~3 s of system time on huge pages the kernel compacted memory for, 0.2 s
    on small ones (sim.memory.numpy_on_small_pages); numpy's default asks for huge pages, so this failed before."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    environment = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"} | env
    done = subprocess.run([sys.executable, "-c", _READ_NUMPY_HUGEPAGE.format(call=call)], capture_output=True,
                          text=True, env=environment, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
