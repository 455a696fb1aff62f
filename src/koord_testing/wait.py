"""Polling with a deadline, for tests that wait on another thread or process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SLOWDOWN_ENV = "KOORD_TEST_SLOWDOWN"
"""How many times slower than this machine the tests run: the cgroup v2 lane's emulated guest
sets it, and every deadline that bounds a hung test (never a measured result) stretches by it."""


def scaled(seconds: float) -> float:
    """``seconds`` stretched by ``$KOORD_TEST_SLOWDOWN`` (default 1; a bad value is an error)."""
    raw = os.environ.get(SLOWDOWN_ENV, "1")
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"${SLOWDOWN_ENV}={raw!r}: want a number >= 1") from None
    if not 1 <= factor <= 100:
        raise ValueError(f"${SLOWDOWN_ENV}={raw!r}: want a number from 1 to 100")
    return seconds * factor


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.1,
             tolerate: tuple[type[Exception], ...] = ()) -> T:
    """Polls until ``predicate()`` is truthy and returns it; AssertionError naming ``what`` and
    the last value at the deadline (the deadline only bounds a hung test; it is ``scaled``).
    Exceptions of the ``tolerate`` types count as "not yet" (a file being replaced or not
    created yet) and are shown as the last value if the deadline passes."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            last: T | Exception = predicate()
        except tolerate as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
