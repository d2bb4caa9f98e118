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
    False where there is no glibc (the allocator then stays as it is)."""
    return _prompt_settings()


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
    they do after any simulation in the process). Nothing changes where there is no glibc."""
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
