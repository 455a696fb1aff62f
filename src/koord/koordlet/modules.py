"""Starting koordlet's modules: a module that cannot start is retried with back-off.

A module whose start raises (a metric cache dir another koordlet holds, a full disk, an
advisor waiting for the metric cache) is not given up on: it stays "down" in
``koordlet_module_up`` and in ``/readyz``, and one retry thread tries every down module
again, in start order, after 1 s, 2 s, 4 s ... up to a minute between rounds. Modules that
need another one (the reporter, advisor and QoS manager need the metric cache) simply
fail to start until it runs, and come up in the same round that brings it up.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("koordlet")

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0


@dataclass
class _Pending:
    name: str
    start: Callable[[], object]
    started: Callable[[object], None]
    attempts: int = 1
    last_error: str = ""


class ModuleStarter:
    """Runs each module's start once now, and retries the failed ones on a thread."""

    def __init__(self, set_up: Callable[[str, bool], None],
                 first_retry: float = FIRST_RETRY_SECONDS, max_retry: float = MAX_RETRY_SECONDS) -> None:
        self._set_up = set_up
        self._first_retry, self._max_retry = first_retry, max_retry
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self, name: str, start: Callable[[], object],
            started: Callable[[object], None] = lambda _: None) -> None:
        """Starts ``name`` now; ``started`` receives what ``start`` returned, now or at the
        retry that succeeds."""
        pending = _Pending(name, start, started)
        if self._attempt(pending):
            return
        with self._lock:
            self._pending.append(pending)
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._retry_loop, name="module-starter",
                                                daemon=True)
                self._thread.start()

    def down(self) -> list[str]:
        """Names of the modules not running yet, in start order."""
        with self._lock:
            return [p.name for p in self._pending]

    def stop(self) -> None:
        """No more retries; a start in progress finishes before this returns."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join()

    def _attempt(self, pending: _Pending) -> bool:
        try:
            result = pending.start()
        except Exception as exc:  # noqa: BLE001 - any failure keeps the module pending
            error = str(exc) or type(exc).__name__
            if error != pending.last_error:  # a failure that repeats is logged once
                log.error("module %s cannot start: %s; the other modules go on, retrying "
                          "with back-off", pending.name, error)
                pending.last_error = error
            self._set_up(pending.name, False)
            return False
        if pending.attempts > 1:
            log.info("module %s running after %d attempts", pending.name, pending.attempts)
        self._set_up(pending.name, True)
        pending.started(result)
        return True

    def _retry_loop(self) -> None:
        delay = self._first_retry
        while not self._stopping.is_set():
            self._wake.wait(delay)
            if self._stopping.is_set():
                return
            with self._lock:
                pending = list(self._pending)
            for p in pending:
                if self._stopping.is_set():
                    return
                p.attempts += 1
                if self._attempt(p):
                    with self._lock:
                        self._pending.remove(p)
            with self._lock:
                if not self._pending:
                    self._thread = None
                    return
            delay = min(delay * 2, self._max_retry)
