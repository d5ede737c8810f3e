"""Freed memory kept by the C allocator between requests, and handed back when idle (glibc).

On Linux, MLX's CPU buffers come from malloc. By default glibc returns large freed blocks to
the kernel (unmapping them, or trimming the top of the heap), so the next request's buffers of
the same sizes are fresh pages, and every page's first touch is a fault (~2.5 µs on this VM).
mlx-lm empties MLX's own buffer cache after every prefill chunk, so that happened on every
request: a new session continuing Claude Code's 12.6k-token prompt on the 2-layer test model
took 4-6k faults, and copying its reused prefix alone took 12 ms instead of 4.

`keep` tells glibc to keep freed blocks for reuse (blocks above its 32 MiB ceiling for that are
still mapped and unmapped each time) and not to trim its heaps; `release` hands what is free back
to the kernel (`malloc_trim`), which the idle sweeper does after clearing MLX's cache. With
another C library (macOS, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys
from functools import cache

log = logging.getLogger(__name__)

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): blocks up to this size
# come from the heap and are reused; larger ones are always mapped afresh.
KEEP_BLOCKS_UP_TO = 32 << 20
# Free memory at the top of a heap before glibc trims it by itself: the most mallopt takes
# (its value is a C int), 2 GiB.
TRIM_ABOVE = 2**31 - 1


@cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def keep() -> bool:
    """Keep freed blocks in the process for reuse. True if the C library took the settings."""
    libc = _glibc()
    if libc is None:
        return False
    kept = bool(libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BLOCKS_UP_TO)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_ABOVE)
    )
    if not kept:
        log.info("freed memory: glibc refused the settings; freed blocks go back at once")
    return kept


def release() -> bool:
    """Hand free memory back to the kernel. True if some was."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(ctypes.c_size_t(0)))
