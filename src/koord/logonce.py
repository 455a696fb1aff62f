"""Say a recurring problem once, not on every round that meets it again.

The agent's loops run every second or few: a missing file, a refused object or an
unreachable peer would otherwise fill the log with one line per round. :class:`LogOnce`
remembers what it said per key and says it again only when

* the problem changed: the key's message differs from the one said (the format string is
  compared, not its ``*args``, so counters and values in the args do not count as a change);
* the problem cleared and came back: :meth:`LogOnce.clear` forgets the key, and returns
  whether it was held so the caller can say the recovery once too;
* (with ``forget_after``) the key was not reported for that many seconds, so a problem that
  went away unnoticed (no caller clears it) and came back later is said again.

Keys name pods, containers and files that come and go, so at most ``max_keys`` are held:
past that, those not reported within ``forget_after`` are dropped, and if that is not
enough, all are (a problem that still holds is then said once more).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Hashable

DEFAULT_MAX_KEYS = 2048


class LogOnce:
    """Log-once / log-on-change state for one owner; thread-safe."""

    def __init__(self, logger: logging.Logger, *, forget_after: float | None = None,
                 max_keys: int = DEFAULT_MAX_KEYS, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._forget_after = forget_after
        self._max_keys = max_keys
        self._clock = clock
        self._held: dict[Hashable, tuple[str, float]] = {}  # key -> (message said, last reported)
        self._lock = threading.Lock()

    def say(self, key: Hashable, message: str, *args: object, level: int = logging.WARNING,
            exc_info: bool = False) -> bool:
        """Logs ``message % args`` unless ``key`` holds the same message (see the module's
        rules); True when it logged."""
        now = self._clock()
        with self._lock:
            held = self._held.get(key)
            fresh = held is not None and held[0] == message and (
                self._forget_after is None or now - held[1] < self._forget_after)
            if held is None and len(self._held) >= self._max_keys:
                self._shrink(now)
            self._held[key] = (message, now)
        if fresh:
            return False
        self._log.log(level, message, *args, exc_info=exc_info, stacklevel=2)  # the caller's file:line
        return True

    def clear(self, key: Hashable) -> bool:
        """The problem under ``key`` is over; True when one was held (it was said)."""
        with self._lock:
            return self._held.pop(key, None) is not None

    def keep_only(self, keys: Container[Hashable]) -> None:
        """Forgets the problems of keys not in ``keys`` (the pods or containers that left)."""
        with self._lock:
            self._held = {k: v for k, v in self._held.items() if k in keys}

    def holds(self, key: Hashable) -> bool:
        """Whether a problem is held under ``key`` (said, and not cleared since)."""
        with self._lock:
            return key in self._held

    def __len__(self) -> int:
        """How many problems are held."""
        with self._lock:
            return len(self._held)

    def _shrink(self, now: float) -> None:
        if self._forget_after is not None:
            limit = self._forget_after
            self._held = {k: v for k, v in self._held.items() if now - v[1] < limit}
        if len(self._held) >= self._max_keys:
            self._held.clear()
