"""glibc malloc settings our long-running processes make at start.

glibc serves a block of at least its mmap threshold (128 KiB at first) with a mapping of
its own, given back when freed; but after freeing such a block it raises the threshold
(up to 32 MiB), so from then on large blocks come from the heap too, and the holes they
leave between longer-lived objects keep the process larger for good. Fixing the threshold
(and the trim threshold with it) stops that adjustment. Elsewhere than glibc (musl) these
are no-ops that say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameter numbers

MMAP_THRESHOLD = 64 << 10
"""koordlet's: blocks this large come and go a few times a second at most (a pod list,
a report), a mapping each costs next to nothing, and none is left behind as a hole. At
100 pods it took the benchmark's RSS from 64.2 to 63.5 MiB (128 KiB fixed: 63.9)."""


def libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def mallopt(param: int, value: int) -> bool:
    """glibc's mallopt; False where it is missing or refuses the value."""
    call = getattr(libc(), "mallopt", None)
    if call is None:
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_int]
    call.restype = ctypes.c_int
    return bool(call(param, value))


def fix_mmap_threshold(size: int = MMAP_THRESHOLD) -> bool:
    """Blocks of ``size`` or more get their own mapping, and the heap's free top beyond twice
    ``size`` is given back, both fixed from now on. Call before any thread starts."""
    return mallopt(M_MMAP_THRESHOLD, size) and mallopt(M_TRIM_THRESHOLD, 2 * size)
