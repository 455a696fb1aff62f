"""One watcher for the directories the processes react to: the proxy's hook config dir,
koordlet's NodeSLO and Node files.

Events come from inotify (``koord.inotify``, as PLEG's) read by the watcher's own thread,
so callers with or without an event loop use it the same way. A burst of events (an editor
writing in several steps, a temp file renamed into place) becomes one ``on_event`` call
once ``debounce`` seconds passed without an event, or ``2 * debounce`` after the burst's
first (a burst that never pauses). The thread sleeps in ``select`` until an event, the
next periodic check or ``stop``: an idle watcher does not wake otherwise.

inotify cannot report everything: a watched directory that is deleted and created again
is a new inode nobody watches, a directory missing at start has nothing to watch, and
inotify's limits can be exhausted by other processes. So ``on_poll`` also runs every
``poll_interval`` seconds whatever happens, the directories' identities are checked then
(and re-watched when they changed), and without inotify polling is all there is.
Callbacks run on the watcher's thread, one at a time; an exception in one is logged, never fatal.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from .inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_Q_OVERFLOW,
    Inotify,
)
from .logonce import LogOnce

log = logging.getLogger(__name__)

DirIdentity = tuple[tuple[str, int, int], ...]

START_TIMEOUT = 10.0
"""How long start() waits for the watch to be set up before it goes on without it."""

FILE_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
             | IN_DELETE_SELF | IN_MOVE_SELF)
_LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_Q_OVERFLOW
"""The directory itself went (or events were lost): an event, and the directories are
looked at again."""


class DirWatcher:
    """Calls ``on_event`` soon after a file in ``dirs`` whose name ``accept`` takes changes, and
    ``on_poll`` (default: ``on_event``) every ``poll_interval`` seconds."""

    def __init__(self, dirs: Iterable[Path], on_event: Callable[[], None], *, name: str,
                 accept: Callable[[str], bool] = lambda name: True, on_poll: Callable[[], None] | None = None,
                 debounce: float = 0.1, poll_interval: float = 1.0) -> None:
        self.dirs = sorted({Path(d) for d in dirs})
        self.name = name
        self._accept = accept
        self._on_event = on_event
        self._on_poll = on_poll or on_event
        self._debounce = debounce
        self._poll = poll_interval
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._wake_r = self._wake_w = -1
        """A pipe ``stop`` writes to: it wakes the thread from ``select`` at once."""
        self._ready = threading.Event()
        self._said = LogOnce(log)

    def start(self) -> None:
        """Returns once the directories are watched (or found unwatchable), so no later change is missed."""
        self._ready.clear()
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(START_TIMEOUT)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._thread = None
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._stopping.clear()

    # -- the watcher's thread ---------------------------------------------------------------

    def _main(self) -> None:
        last: DirIdentity | None = None
        while not self._stopping.is_set():
            identity = self._identity()
            changed = last is not None and identity != last
            last = identity
            inotify = self._watched(identity) if identity else None
            if not identity:
                self._report(f"none of {', '.join(map(str, self.dirs))} exists yet; checking every {self._poll:g}s")
            if changed:  # a directory appeared, went away or was replaced; said once it is
                self._call(self._on_event)  # watched, so what the callee reads is all there was
            if inotify is None:
                self._poll_once()
                continue
            try:
                self._watch(inotify, identity)
            except OSError as exc:  # reading the events failed: poll, then watch afresh
                self._unwatchable(identity, exc)
                self._poll_once()
            finally:
                inotify.close()

    def _watched(self, identity: DirIdentity) -> Inotify | None:
        """inotify on the directories; None (said) when it cannot be set up, e.g. inotify's
        limits reached: polling still keeps callers current."""
        try:
            inotify = Inotify()
        except OSError as exc:
            self._unwatchable(identity, exc)
            return None
        try:
            for d, _, _ in identity:
                inotify.add_watch(Path(d), FILE_MASK)
        except OSError as exc:
            inotify.close()
            self._unwatchable(identity, exc)
            return None
        return inotify

    def _unwatchable(self, identity: DirIdentity, exc: OSError) -> None:
        self._report(f"cannot watch {', '.join(d for d, _, _ in identity)} ({exc}); "
                     f"checking every {self._poll:g}s instead")

    def _watch(self, inotify: Inotify, identity: DirIdentity) -> None:
        """Watches until stopped or until a directory appears, disappears or is replaced."""
        log.debug("%s: watching %s", self.name, ", ".join(d for d, _, _ in identity))
        self._said.clear("problem")  # watching again: a new problem is worth a new warning
        if not self._ready.is_set():  # what changed before the watch was set up
            self._call(self._on_poll)
            self._ready.set()
        next_poll = time.monotonic() + self._poll
        first = last = None  # the pending burst's first and last event
        lost = False
        while not self._stopping.is_set():
            now = time.monotonic()
            deadline = next_poll if first is None or last is None else min(
                next_poll, last + self._debounce, first + 2 * self._debounce)
            readable, _, _ = select.select([inotify.fd, self._wake_r], [], [], max(0.0, deadline - now))
            if self._wake_r in readable:
                return
            now = time.monotonic()
            if inotify.fd in readable:
                for _, mask, name in inotify.read():
                    if mask & _LOST:
                        lost = True
                    elif not self._accept(name):
                        continue
                    first = now if first is None else first
                    last = now
            if first is not None and last is not None and (
                    now - last >= self._debounce or now - first >= 2 * self._debounce):
                first = last = None
                self._call(self._on_event)
                if lost or self._identity() != identity:
                    return
            if now >= next_poll:
                next_poll = now + self._poll
                self._call(self._on_poll)
                if self._identity() != identity:
                    return

    def _poll_once(self) -> None:
        """Waits one poll interval (or until stopped), then runs the periodic check."""
        self._ready.set()
        readable, _, _ = select.select([self._wake_r], [], [], self._poll)
        if not readable:
            self._call(self._on_poll)

    def _identity(self) -> DirIdentity:
        ids = []
        for d in self.dirs:
            try:
                st = os.stat(d)
            except OSError:
                continue
            ids.append((os.fspath(d), st.st_dev, st.st_ino))
        return tuple(ids)

    def _call(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a failing consumer must not end the watch
            log.exception("%s: change callback failed", self.name)

    def _report(self, message: str) -> None:
        """Logs a problem once, not on every retry."""
        self._said.say("problem", f"{self.name}: {message}")
