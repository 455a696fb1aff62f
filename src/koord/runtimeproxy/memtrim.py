"""Gives memory back to the OS after very large messages.

glibc keeps freed memory in its heap, and after freeing a large block it raises its mmap
threshold, so the next large message is allocated from the heap too: messages of tens of
MiB left the proxy that much larger for good.  Two measures: one malloc arena for the
process (``limit_arenas``, at start), and ``malloc_trim(0)`` after a large message, which
returns the free pages; it walks the heap (a few ms), so it runs only after a large
message, at most once per ``delay``, off the call's path.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

LARGE_MESSAGE_BYTES = 4 << 20
"""Messages below this come and go within glibc's normal reuse; above it they pile up."""


_M_ARENA_MAX = -8  # glibc's mallopt parameter number
ARENA_MAX = 1
"""One malloc arena for the whole process: glibc's malloc_trim gives back the free top of
the main arena only, so memory freed in a per-thread arena (where grpc's threads put
message buffers) would stay.  The proxy's Python code runs on one thread anyway."""


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None on a libc without it (musl)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def limit_arenas() -> bool:
    """Call before any thread starts (grpc's included); False where glibc's mallopt is missing."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, ARENA_MAX))


class MemoryTrimmer:
    def __init__(self, threshold: int = LARGE_MESSAGE_BYTES, delay: float = 0.5,
                 trim: Callable[[int], int] | None = None) -> None:
        self.threshold = threshold
        self.delay = delay
        self._trim = trim if trim is not None else _load_malloc_trim()
        self._pending = False
        self.trims = 0

    def note(self, size: int) -> None:
        """Called with every message size on the event loop; schedules one trim after a large one."""
        if size < self.threshold or self._pending or self._trim is None:
            return
        self._pending = True
        # Later, not now: the message's buffers are freed only once the call is done.
        asyncio.get_running_loop().call_later(self.delay, self._run)

    def _run(self) -> None:
        self._pending = False
        assert self._trim is not None
        gc.collect()
        self._trim(0)
        self.trims += 1
        log.debug("returned free heap memory to the OS after a large message")
