"""Keeping a long CPU run's memory flat.

glibc's allocator keeps freed memory in per-thread arenas; a training run that allocates tensors of
changing shapes from several threads (rollouts, the extractor track, the retrieval micro-batcher)
grows its resident size step after step although nothing is leaked — measured: a ``cpu``-preset
``comp_rl`` run on MiniHack reached 13.4 GB and was killed by the kernel on a 24 GB machine.
Fewer arenas and handing free pages back after each step keep it bounded. Both are no-ops where
glibc is absent (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018  (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for threads created from now on. True if applied."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(_M_ARENA_MAX, int(arenas)) == 1)


def release_free_memory() -> bool:
    """Return freed heap pages to the OS (glibc ``malloc_trim``). True if any were returned."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def peak_rss_gb() -> float:
    """The largest resident set size this process has had, in GB (``getrusage``; Linux KB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def rss_gb() -> float:
    """This process's resident set size in GB (Linux; NaN elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return float("nan")
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 1e9
