"""Polling with a deadline, for tests that wait on another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Polls until ``predicate()`` is truthy and returns it; AssertionError naming ``what`` and
    the last value at the deadline (the deadline only bounds a hung test)."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
        last = predicate()
    return last
