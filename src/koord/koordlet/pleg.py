"""PLEG: pods and containers seen the moment their cgroup directory appears.

The pod list is polled every ``--kubelet-sync-interval`` (10 s) and the Standalone
reconciler every ``--runtime-hooks-reconcile-interval`` (10 s), so without this a BE pod
created behind the proxy's back would run unlimited for up to ten seconds. As upstream's
pkg/koordlet/pleg, inotify watches the kube-QoS cgroup directories (the kube dir itself
for guaranteed pods, ``burstable``, ``besteffort``; either driver's names) for pod
directories, and each pod directory for container directories; on cgroup v1 the ``cpu``
hierarchy stands for all (runc creates a cgroup in every hierarchy at once), on v2 the
one tree. ``mkdir``/``rmdir`` on cgroupfs go through the VFS, so inotify reports them
(writes to cgroup files do not matter here and are not asked for).

What a change triggers is the callers' (``on_change``): a pod sync and a reconcile round.
It is bounded whatever the churn: events of one burst are coalesced (``settle``), calls are
rate limited (5 a second, burst 10, upstream's numbers), and one more call follows a burst
by ``follow_up`` seconds (a container's directory appears at ``runc create``, a moment
before the runtime reports it running). The kernel's queue is bounded by
``max_queued_events``: an overflow means "rescan", never a backlog here. Watches are
bounded by ``max_watches``; pod directories beyond it are left to the poll, which remains
the safety net for anything inotify cannot report (a tree mounted late, a watch limit hit
in another process).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
    InotifyError,
)
from ..logonce import LogOnce
from .cgrouplayout import DRIVERS
from .resourceexecutor.executor import CgroupExecutor
from .runtimehooks.protocol import KubeQoS

log = logging.getLogger(__name__)

DIR_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR
DEFAULT_MAX_WATCHES = 8192
QOS, POD, ANCESTOR = "qos", "pod", "ancestor"
"""What a watched directory is: a kube-QoS dir (pod dirs appear in it), a pod dir (container
dirs appear in it), or the nearest existing ancestor of a QoS dir not there yet."""
RATE_PER_SECOND, BURST = 5.0, 10


def is_pod_dir(name: str) -> bool:
    """A pod's cgroup under a kube-QoS dir: ``pod<uid>`` (cgroupfs) or
    ``kubepods[-<qos>]-pod<uid>.slice`` (systemd)."""
    return name.startswith("pod") or (name.endswith(".slice") and "-pod" in name)


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``wait_time()`` says how long until one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._last = float(burst), clock()

    def take(self) -> float:
        """Takes a token if there is one (0.0), else the seconds until there is."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


class Pleg:
    """Watches the pod and container cgroup directories; ``on_change`` after each burst."""

    def __init__(self, executor: CgroupExecutor, on_change: Iterable[Callable[[], None]], *,
                 settle: float = 0.05, follow_up: float = 0.5, rescan_interval: float = 5.0,
                 max_watches: int = DEFAULT_MAX_WATCHES) -> None:
        self.executor = executor
        self.on_change = list(on_change)
        self.settle = settle
        self.follow_up = follow_up
        self.rescan_interval = rescan_interval
        self.max_watches = max_watches
        self.events = 0
        """Directory events seen (pods and containers, added or gone); for tests and logs."""
        self._inotify: Inotify | None = None
        self._watches: dict[int, tuple[Path, str]] = {}  # wd -> (dir, QOS, POD or ANCESTOR)
        self._watched: dict[Path, int] = {}
        self._limiter = TokenBucket(RATE_PER_SECOND, BURST)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._said = LogOnce(log)

    def qos_dirs(self) -> list[Path]:
        """The kube-QoS directories in the hierarchy that stands for all (v1: ``cpu``); with
        the driver left to detection, both drivers' (a node may hold both trees, and kubelet's
        pods are in one of them)."""
        ex = self.executor
        drivers = [ex.layout.driver] if ex.layout.driver else DRIVERS
        return [ex.path(ex.layout.kube_qos_dir(qos, driver), "cpu_shares", keep=False).parent
                for driver in drivers for qos in KubeQoS]

    def _hierarchy(self) -> Path:
        return self.executor.path("", "cpu_shares").parent

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Watches from now on; without inotify (no libc call, no descriptors left) it logs
        why and the polls alone keep pods current."""
        try:
            self._inotify = Inotify()
        except (OSError, AttributeError) as exc:
            log.warning("PLEG: no inotify (%s); new pods are found by polling only", exc)
            return
        self._rescan()
        qos = [str(d) for d, kind in self._watches.values() if kind == QOS] or ["no kube-QoS dir yet"]
        log.info("PLEG: watching %s for pods (%d directories)", ", ".join(qos), len(self._watched))
        self._thread = threading.Thread(target=self._run, name="pleg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._watches.clear()
        self._watched.clear()

    # ---- watches ------------------------------------------------------------------------

    def _watch(self, directory: Path, kind: str) -> bool:
        """True when ``directory`` is watched (now or already)."""
        assert self._inotify is not None
        if directory in self._watched:
            return True
        if len(self._watched) >= self.max_watches:
            self._report(f"{self.max_watches} directories watched already: pods beyond are found "
                         "by polling")
            return False
        try:
            wd = self._inotify.add_watch(directory, DIR_MASK)
        except InotifyError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # gone meanwhile: normal churn
                self._report(f"cannot watch {directory}: {exc.strerror}; polling covers it")
            return False
        self._watches[wd] = (directory, kind)
        self._watched[directory] = wd
        return True

    def _forget(self, wd: int) -> None:
        found = self._watches.pop(wd, None)
        if found is not None and self._watched.get(found[0]) == wd:
            del self._watched[found[0]]

    def _unwatch(self, directory: Path) -> None:
        """Stops watching a directory that is gone. cgroupfs does not end the watch of a
        removed cgroup itself (no IN_IGNORED, unlike tmpfs): left alone, every removed pod
        would keep a kernel watch, its dead cgroup's inode and a place under
        ``max_watches`` until PLEG stopped seeing new pods."""
        wd = self._watched.get(directory)
        if wd is not None:
            assert self._inotify is not None
            self._inotify.rm_watch(wd)  # the IN_IGNORED that follows finds nothing to forget
            self._forget(wd)

    def _rescan(self) -> bool:
        """(Re)watches every QoS dir and the pod dirs in them: at start, after an overflow,
        when a directory on the way to a QoS dir appears, and every rescan interval. A QoS dir
        that does not exist yet (kubelet not started, the tree removed and made again) has its
        nearest existing ancestor watched instead, so its creation is seen at once. True when
        a pod dir not watched before was found: it may have come with its containers unseen."""
        found = False
        hierarchy = self._hierarchy()
        listed: dict[Path, set[str]] = {}  # QoS dir -> the directories in it now
        for qos_dir in self.qos_dirs():
            names: set[str] | None = None
            if self._watch(qos_dir, QOS):
                try:
                    names = {e.name for e in os.scandir(qos_dir) if e.is_dir(follow_symlinks=False)}
                except (FileNotFoundError, NotADirectoryError):  # removed; its watch left over
                    self._unwatch(qos_dir)
                    listed[qos_dir] = set()
                except OSError:
                    continue
            if names is None:
                ancestor = qos_dir.parent
                while ancestor != hierarchy and not ancestor.is_dir() and hierarchy in ancestor.parents:
                    ancestor = ancestor.parent
                self._watch(ancestor, ANCESTOR)
                continue
            listed[qos_dir] = names
            for name in names:
                if is_pod_dir(name) and qos_dir / name not in self._watched:
                    found |= self._watch(qos_dir / name, POD)
        # Pod dirs whose removal went unseen (an overflowed queue): their watches go too.
        for directory, kind in list(self._watches.values()):
            if kind == POD and directory.parent in listed and directory.name not in listed[directory.parent]:
                self._unwatch(directory)
        return found

    def _report(self, message: str) -> None:
        self._said.say("problem", f"PLEG: {message}")

    # ---- the loop -----------------------------------------------------------------------

    def _handle(self, events: list[tuple[int, int, str]]) -> bool:
        """Updates the watches; True when a pod or container directory came or went."""
        changed = False
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                log.info("PLEG: the kernel's event queue overflowed; rescanning")
                self._rescan()
                changed = True
                continue
            if mask & IN_IGNORED:  # the directory is gone (or unwatched): the kernel dropped it
                self._forget(wd)
                continue
            found = self._watches.get(wd)
            if found is None or not mask & IN_ISDIR:
                continue
            directory, kind = found
            created = bool(mask & (IN_CREATE | IN_MOVED_TO))
            if kind == ANCESTOR or (kind == QOS and not is_pod_dir(name)):
                if created:  # maybe a QoS dir or one on the way to it, with pods already inside
                    changed |= self._rescan()
                continue
            changed = True
            self.events += 1
            if kind == QOS:
                log.debug("PLEG: pod directory %s/%s %s", directory, name,
                          "created" if created else "removed")
                if created:
                    self._watch(directory / name, POD)
                else:
                    self._unwatch(directory / name)
            else:
                log.debug("PLEG: container directory %s/%s %s", directory, name,
                          "created" if created else "removed")
        return changed

    def _run(self) -> None:
        assert self._inotify is not None
        fd = self._inotify.fd
        due: float | None = None  # when on_change runs next
        due_to_events = False  # False: the follow-up of a burst, which gets none itself
        follow_up: float | None = None
        next_rescan = time.monotonic() + self.rescan_interval
        while not self._stopping.is_set():
            now = time.monotonic()
            deadline = min(t for t in (due, follow_up, next_rescan, now + 0.5) if t is not None)
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - now))
            if self._stopping.is_set():
                return
            now = time.monotonic()
            if readable and self._handle(self._inotify.read()):
                if due is None:  # coalesce a burst; never postponed past its first event
                    due = now + self.settle
                due_to_events = True
            if now >= next_rescan:
                next_rescan = now + self.rescan_interval
                if self._rescan() and due is None:
                    due, due_to_events = now + self.settle, True
            if follow_up is not None and now >= follow_up:
                follow_up = None
                if due is None:
                    due, due_to_events = now, False
            if due is None or now < due:
                continue
            wait = self._limiter.take()
            if wait > 0:
                due = now + wait
                continue
            if due_to_events:
                follow_up = now + self.follow_up
            due, due_to_events = None, False
            self._notify()

    def _notify(self) -> None:
        for fn in self.on_change:
            try:
                fn()
            except Exception:  # a failing consumer must not end the watch
                log.exception("PLEG: change callback %s failed", getattr(fn, "__qualname__", fn))
