"""Whether the API server answers, logged once per change, shared by everything that calls it.

While the API server is down, each list-watch thread and the NodeMetric writer fail every
few seconds; logging each failure (and urllib3's own retry warnings) buried the log in
about a hundred lines a minute. Callers report each request's outcome here instead: the
first connection failure logs one line, the first success after it one line saying for how
long it was gone. A failure of a request that began before the last success is a leftover
of the outage just ended and is not logged again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Reachability:
    def __init__(self, host: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._up_since = -float("inf")

    def now(self) -> float:
        """The time to pass back as ``started`` (the moment a request begins)."""
        return self._clock()

    @property
    def down(self) -> bool:
        with self._lock:
            return self._down_since is not None

    def failed(self, what: str, exc: BaseException, started: float) -> None:
        """A request (``what``) begun at ``started`` could not reach the server."""
        with self._lock:
            if self._down_since is not None or started < self._up_since:
                return
            self._down_since = self._clock()
        log.warning("API server %s unreachable (%s: %s); retrying quietly until it answers",
                    self.host, what, _short(exc))

    def answered(self) -> None:
        """A request got an HTTP answer (any status): the server is there."""
        with self._lock:
            if self._down_since is None:
                return
            gone = self._clock() - self._down_since
            self._down_since = None
            self._up_since = self._clock()
        log.info("API server %s reachable again after %.0fs", self.host, gone)


def _short(exc: BaseException) -> str:
    """urllib3's MaxRetryError repeats the URL and the whole retry history; keep its cause."""
    reason = getattr(exc, "reason", None)
    text = str(reason if isinstance(reason, BaseException) else exc)
    return text if len(text) <= 200 else text[:197] + "..."
