"""koordlet's client-side limit on requests to the API server (``-kube-api-qps``,
``-kube-api-burst``), as client-go's token bucket: ``burst`` requests may go at once, then
``qps`` a second. As client-go's rest config reads them, qps 0 means 5, burst 0 means 10,
and a negative qps means no limit.

Every request of the ``kubernetes`` client passes through its REST client's ``request``
(watches too, when they start), so the limit wraps that one method.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

DEFAULT_QPS, DEFAULT_BURST = 5.0, 10
"""client-go's values for a zero qps or burst."""


class TokenBucket:
    """``acquire()`` blocks until a token is free. Thread-safe: the waits are served in the
    order the callers reserved their tokens."""

    def __init__(self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not qps > 0 or burst < 1:
            raise ValueError(f"token bucket: qps {qps} and burst {burst}: want qps > 0 and burst >= 1")
        self.qps, self.burst = qps, burst
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = clock()

    def reserve(self) -> float:
        """Takes a token (possibly one not yet refilled); returns how long to wait for it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self) -> None:
        wait = self.reserve()
        if wait > 0:
            self._sleep(wait)


def bucket_for(qps: float, burst: int) -> TokenBucket | None:
    """The bucket ``-kube-api-qps`` and ``-kube-api-burst`` ask for; None for no limit."""
    if qps == 0:
        qps = DEFAULT_QPS
    if burst == 0:
        burst = DEFAULT_BURST
    return TokenBucket(qps, burst) if qps > 0 else None


def limit_client(api_client: Any, qps: float, burst: int) -> Any:
    """Makes every request of ``api_client`` (a ``kubernetes.client.ApiClient``) take a token
    first; returns it."""
    bucket = bucket_for(qps, burst)
    if bucket is None:
        return api_client
    rest = api_client.rest_client
    request = rest.request

    def limited(*args: Any, **kwargs: Any) -> Any:
        bucket.acquire()
        return request(*args, **kwargs)

    rest.request = limited
    return api_client
