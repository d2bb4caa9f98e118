"""Keeping a long simulation's resident memory near what it holds (glibc's allocator; elsewhere nothing changes).

A simulation grows thousands of arrays step by step (every replica's step log and step ends, every running
request's tokens) while it makes and drops many short-lived ones. glibc serves the growing arrays from its heap
once its adaptive mmap threshold has risen, and the holes they leave as they move stay resident. With a fixed
mmap threshold (large blocks mapped on their own, and grown in place by mremap) and a heap trimmed as soon as its
top is free, ``benchmarks/sim_million.py --requests 30000`` (64 replicas) peaked at 0.35 GiB resident instead of
0.49 GiB, at the same CPU time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks from this size on get a mapping of their own (glibc's default starting point, kept fixed instead of
# rising with every mapped block freed).
_MMAP_THRESHOLD_BYTES = 64 * 1024


@cache
def _libc():
    """glibc, with mallopt and malloc_trim typed, or None where there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    except (OSError, AttributeError):
        return None
    return libc


@cache
def return_freed_memory_promptly() -> bool:
    """Ask glibc, once per process, to map large blocks on their own and give back the heap's free top at once;
    False where there is no glibc (the allocator then stays as it is). Also keeps numpy's arrays on small pages
    (``numpy_on_small_pages``)."""
    numpy_on_small_pages()
    return _prompt_settings()


# What a simulated step costs in memory by the time its run's outputs are written: its compact record and end time in
# the simulation, then a row of every step column and the summary's and report's passes over them. Measured peaks:
# the Azure trace, 1.78M steps, 742 MB (188 MB after the simulation); 20,000 requests at 0.5 req/s, 5.9M steps,
# 1.78 GB (285 MB after it): 420 and 300 bytes a step all told, the requests' own tables included.
BYTES_PER_STEP_WRITTEN = 400


def max_steps_to_write(available_bytes: int | None) -> int | None:
    """The most steps whose outputs fit in ``available_bytes`` of host memory (None: not known, no limit)."""
    return None if available_bytes is None else max(available_bytes // BYTES_PER_STEP_WRITTEN, 1)


@cache
def numpy_on_small_pages() -> bool:
    """Stop numpy asking the kernel for transparent huge pages for its large arrays (madvise), once per process,
    unless NUMPY_MADVISE_HUGEPAGE says what the user wants; False where numpy has no such switch.

    Where the kernel defragments synchronously for regions that ask (``defrag`` = ``madvise``, its default), the
    first touch of each 2 MiB page can wait for memory to be compacted. Writing the Azure trace's outputs (1.78M
    steps, ~550 MB of short-lived arrays) took 2.9-3.1 CPU s of system time with huge pages and 0.2 s without, on
    a 2-core VM where the kernel had to compact to find them; the user time was within 0.1 s. A simulation's arrays are
    written or reduced once, so the TLB misses huge pages save do not show."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return False
    try:
        from numpy._core.multiarray import _set_madvise_hugepage
    except ImportError:  # numpy 1.x
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return False
    _set_madvise_hugepage(False)
    return True


def _prompt_settings() -> bool:
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 0))


# While outputs are written: blocks up to glibc's largest mmap threshold (32 MiB on 64-bit) come from the heap, and
# up to this much of its free top is kept.
_REUSE_MMAP_THRESHOLD_BYTES = 32 * 2**20
_REUSE_TRIM_THRESHOLD_BYTES = 2**30


@contextmanager
def reusing_freed_memory() -> Iterator[None]:
    """Within: large blocks from glibc's heap, their pages kept when freed, so the many short-lived arrays of a
    run's outputs (a million-step log's columns and the temporaries computed over them, 13 MB each on the Azure
    trace) reuse pages already touched instead of each mapping fresh ones that the kernel zero-fills page by page
    at first touch (under ``return_freed_memory_promptly``'s settings, a third of the outputs' CPU time). On exit,
    the heap's free top goes back to the system and ``return_freed_memory_promptly``'s settings apply again (as
    they do after any simulation in the process). Simulations within keep these settings (a capacity sweep's
    moderate ones, many in a row: analysis.capacity.executors). Nothing changes where there is no glibc."""
    # Once per process, before these: a simulation within asks for them and then leaves these as they are. (Outputs
    # are written without a simulation in this process too: sim.replay --bands.)
    return_freed_memory_promptly()
    libc = _libc()
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _REUSE_MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, _REUSE_TRIM_THRESHOLD_BYTES)
    try:
        yield
    finally:
        _prompt_settings()
        libc.malloc_trim(0)
