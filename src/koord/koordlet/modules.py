"""koordlet's modules and their starter: started in order, retried while they cannot start,
stopped in reverse.

A module whose start raises (a metric cache dir another koordlet holds, a full disk, an
advisor waiting for the metric cache) is not given up on: it stays "down" in
``koordlet_module_up`` and in ``/readyz``, and one retry thread tries every down module
again, in start order, after 1 s, 2 s, 4 s ... up to a minute between rounds. Modules that
need another one (the reporter, advisor and QoS manager need the metric cache) simply
fail to start until it runs, and come up in the same round that brings it up. A required
module (the runtime hooks: without their server the proxy cannot reach koordlet) is not
retried: its failure ends the start and reaches the caller.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ..logonce import LogOnce

log = logging.getLogger("koordlet")

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 60.0

T = TypeVar("T")


class Module(Protocol):
    """One part of the agent, as the starter sees it."""

    @property
    def name(self) -> str:
        """The ``module`` label of ``koordlet_module_up``."""
        ...

    @property
    def required(self) -> bool:
        """A failed start ends the agent's start instead of being retried."""
        ...

    def start(self) -> None:
        """Raises when the module cannot start (yet)."""

    def stop(self) -> None:
        """Called once, only after a start that returned."""

    def ready(self) -> str:
        """Why the module keeps ``/readyz`` failing; "" when it does not."""
        ...


@dataclass
class Started(Generic[T]):
    """A module made of the object ``run`` builds and starts (from the modules it needs,
    raising while they do not run); ``running`` holds that object while it runs, so the
    modules started after it reach it there."""

    name: str
    run: Callable[[], T]
    end: Callable[[T], None]
    """How the running object is stopped (or closed)."""
    reason: Callable[[], str] = lambda: ""
    """What ``ready`` answers."""
    required: bool = False
    running: T | None = None

    def start(self) -> None:
        self.running = self.run()

    def stop(self) -> None:
        running, self.running = self.running, None
        if running is not None:
            self.end(running)

    def ready(self) -> str:
        return self.reason()


@dataclass
class _Pending:
    module: Module
    attempts: int = 1
    said: LogOnce = field(default_factory=lambda: LogOnce(log))


class ModuleStarter:
    """Starts ``modules`` in order, retries the failed ones on a thread, and stops the
    running ones in reverse order."""

    def __init__(self, modules: Sequence[Module], set_up: Callable[[str, bool], None],
                 first_retry: float = FIRST_RETRY_SECONDS, max_retry: float = MAX_RETRY_SECONDS) -> None:
        self.modules = list(modules)
        self._set_up = set_up
        self._first_retry, self._max_retry = first_retry, max_retry
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._running: set[str] = set()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts every module now, in order; a failed one is retried (see the module's
        docstring). A required module's failure is raised at once, the modules after it
        not started."""
        for module in self.modules:
            pending = _Pending(module)
            if self._attempt(pending, raise_required=True):
                continue
            with self._lock:
                self._pending.append(pending)
                if self._thread is None and not self._stopping.is_set():
                    self._thread = threading.Thread(target=self._retry_loop, name="module-starter",
                                                    daemon=True)
                    self._thread.start()

    def down(self) -> list[str]:
        """Names of the modules not running yet, in start order."""
        with self._lock:
            return [p.module.name for p in self._pending]

    def ready(self) -> tuple[bool, str]:
        """``/readyz``: every module running, then none with a reason to wait."""
        down = self.down()
        if down:
            return False, "modules not running: " + ", ".join(down)
        for module in self.modules:
            reason = module.ready()
            if reason:
                return False, reason
        return True, ""

    def stop(self) -> None:
        """No more retries (a start in progress finishes first), then the running modules
        stopped in reverse start order."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join()
        for module in reversed(self.modules):
            with self._lock:
                running = module.name in self._running
                self._running.discard(module.name)
            if running:
                module.stop()

    def _attempt(self, pending: _Pending, raise_required: bool = False) -> bool:
        module = pending.module
        try:
            module.start()
        except Exception as exc:  # noqa: BLE001 - any failure keeps the module pending
            if raise_required and module.required:
                raise
            error = str(exc) or type(exc).__name__
            pending.said.say("start", f"module {module.name} cannot start: {error}; the other modules go on, "
                             "retrying with back-off", level=logging.ERROR)
            self._set_up(module.name, False)
            return False
        if pending.attempts > 1:
            log.info("module %s running after %d attempts", module.name, pending.attempts)
        with self._lock:
            self._running.add(module.name)
        self._set_up(module.name, True)
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
