"""One watcher for the directories the processes react to: the proxy's hook config dir,
koordlet's NodeSLO and Node files.

Events come from ``watchfiles`` (inotify, through Rust's notify) on an asyncio loop that
runs in the watcher's own thread, so callers with or without an event loop use it the
same way. A burst of events (an editor writing in several steps, a temp file renamed into
place) becomes one ``on_event`` call ``debounce`` to twice ``debounce`` seconds after its
last event: watchfiles looks for new events every ``debounce`` (its ``step``; each look
wakes a thread and takes the GIL, so it is as long as the debounce allows) and delivers
once a look finds none (a burst that never pauses, about every ``debounce``).

inotify cannot report everything: a watched directory that is deleted and created again
is a new inode nobody watches, a directory missing at start has nothing to watch, and
inotify's limits can be exhausted by other processes. So ``on_poll`` also runs every
``poll_interval`` seconds whatever happens, the directories' identities are checked then
(and re-watched when they changed), and without inotify polling is all there is. The check
is a timer on the loop: the watch itself never times out, since every return from
watchfiles hands the watch to a worker thread again, the costliest part of an idle watcher.
Callbacks run on the watcher's thread, one at a time; an exception in one is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from watchfiles import Change, awatch

from .logonce import LogOnce

log = logging.getLogger(__name__)
# watchfiles says "N changes detected" at INFO for every batch of events: a log file kept
# beside a watched file would write a line per second. The watcher's own lines suffice.
logging.getLogger("watchfiles.main").setLevel(logging.WARNING)

DirIdentity = tuple[tuple[str, int, int], ...]

START_TIMEOUT = 10.0
"""How long start() waits for the watch to be set up before it goes on without it."""


class _EitherEvent:
    """The stop event watchfiles checks at every step: set when either event is. ``set`` is
    what awatch calls when its task is cancelled."""

    def __init__(self, stop: asyncio.Event, leave: asyncio.Event) -> None:
        self._stop = stop
        self._leave = leave

    def is_set(self) -> bool:
        return self._stop.is_set() or self._leave.is_set()

    def set(self) -> None:
        self._leave.set()


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
        self._debounce_ms = max(1, round(debounce * 1000))
        self._poll = poll_interval
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._said = LogOnce(log)
        self._lost = False

    def start(self) -> None:
        """Returns once the directories are watched (or found unwatchable), so no later change is missed."""
        self._ready.clear()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(START_TIMEOUT)

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()
        self._thread = None

    # -- the watcher's thread ---------------------------------------------------------------

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        last: DirIdentity | None = None
        while not self._stop.is_set():
            identity = self._identity()
            if last is not None and identity != last:
                self._call(self._on_event)  # a directory appeared, went away or was replaced
            last = identity
            if not identity:
                self._report(f"none of {', '.join(map(str, self.dirs))} exists yet; checking every {self._poll:g}s")
                await self._poll_once()
                continue
            try:
                await self._watch(identity)
            except Exception as exc:  # e.g. inotify limits reached: polling still keeps callers current
                self._report(f"cannot watch {', '.join(d for d, _, _ in identity)} ({exc}); "
                             f"checking every {self._poll:g}s instead")
                await self._poll_once()

    async def _watch(self, identity: DirIdentity) -> None:
        """Watches until stopped or until a directory appears, disappears or is replaced."""
        self._lost = False
        log.debug("%s: watching %s", self.name, ", ".join(d for d, _, _ in identity))
        assert self._loop is not None and self._stop is not None
        leave = asyncio.Event()
        # awatch sets up inotify before its first await; this runs right after that, so anything
        # changed from here on is reported, and the poll catches what changed before.
        watching = self._loop.call_soon(self._watching)
        checks = asyncio.ensure_future(self._check_while_watching(identity, leave))
        try:
            async for _ in awatch(*(d for d, _, _ in identity), watch_filter=self._filter,
                                  debounce=self._debounce_ms, step=self._debounce_ms,
                                  stop_event=_EitherEvent(self._stop, leave), rust_timeout=0,
                                  recursive=False, force_polling=False, ignore_permission_denied=True):
                self._call(self._on_event)
                if self._moved(identity):
                    return
        except BaseException:
            watching.cancel()  # inotify could not be set up: not watching after all
            raise
        finally:
            checks.cancel()

    async def _check_while_watching(self, identity: DirIdentity, leave: asyncio.Event) -> None:
        """The periodic check while watching; sets ``leave`` (ending the watch) once a
        directory appeared, went away or was replaced."""
        while True:
            await asyncio.sleep(self._poll)
            self._call(self._on_poll)
            if self._moved(identity):
                leave.set()
                return

    def _moved(self, identity: DirIdentity) -> bool:
        """Re-watch; after a delete always, since a new directory may reuse the inode number."""
        return self._lost or self._identity() != identity

    async def _poll_once(self) -> None:
        assert self._stop is not None
        self._ready.set()
        try:
            await asyncio.wait_for(self._stop.wait(), self._poll)
        except TimeoutError:
            self._call(self._on_poll)

    def _watching(self) -> None:
        self._said.clear("problem")  # watching again: a new problem is worth a new warning
        if not self._ready.is_set():
            self._call(self._on_poll)
            self._ready.set()

    def _filter(self, change: Change, path: str) -> bool:
        if change is Change.deleted and Path(path) in self.dirs:
            self._lost = True
            return True
        return self._accept(os.path.basename(path))

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
