"""Core-scheduling cookies: which group a pod's processes belong to and how they get its cookie.

Processes with the same cookie may share an SMT core; others never run on siblings at once.
Pods are grouped as upstream groups them: the ``koordinator.sh/core-sched-group-id`` label
(default: the one unnamed group), ``koordinator.sh/core-sched-policy: exclusive`` makes the
pod's uid its group, ``none`` turns it off for the pod, and an expeller class (coreExpeller)
gets its own groups (``<group>-expeller``).

The kernel's interface is ``prctl(PR_SCHED_CORE, ...)``; ``PrctlCookies`` wraps it and
``CookieOps`` is what the manager needs, so the logic is tested against a stub on kernels
without CONFIG_SCHED_CORE (this project's machines).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from koord.apis.extension import LABEL_CORE_SCHED_GROUP_ID, LABEL_CORE_SCHED_POLICY

from ..protocol import KoordQoS, KubeQoS
from .coreschedrule import CoreSchedRule

log = logging.getLogger(__name__)

EXPELLER_SUFFIX = "-expeller"
NO_COOKIE = 0

PR_SCHED_CORE = 62
PR_SCHED_CORE_GET, PR_SCHED_CORE_CREATE, PR_SCHED_CORE_SHARE_TO, PR_SCHED_CORE_SHARE_FROM = 0, 1, 2, 3
PIDTYPE_PID = 0
K = TypeVar("K")


class CookieError(OSError):
    """A prctl call failed; ESRCH (the process exited) is the caller's to ignore."""


class CookieOps(Protocol):
    def get(self, pid: int) -> int: ...

    def create(self, pid: int) -> int: ...

    def share(self, from_pid: int, to_pid: int) -> None: ...

    def clear(self, pid: int) -> None: ...


class PrctlCookies:
    """The kernel's cookies through prctl. Sharing goes through the calling thread (pull the
    cookie from one process, push it to another, drop it again), as the kernel offers it."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._lock = threading.Lock()

    def _prctl(self, cmd: int, pid: int, arg: object = 0) -> None:
        if self._libc.prctl(PR_SCHED_CORE, cmd, pid, PIDTYPE_PID, arg) != 0:
            err = ctypes.get_errno()
            raise CookieError(err, f"prctl(PR_SCHED_CORE, {cmd}, pid {pid}): {os.strerror(err)}")

    def get(self, pid: int) -> int:
        cookie = ctypes.c_uint64(0)
        self._prctl(PR_SCHED_CORE_GET, pid, ctypes.byref(cookie))
        return cookie.value

    def create(self, pid: int) -> int:
        self._prctl(PR_SCHED_CORE_CREATE, pid)
        return self.get(pid)

    def share(self, from_pid: int, to_pid: int) -> None:
        with self._lock:
            self._prctl(PR_SCHED_CORE_SHARE_FROM, from_pid)
            try:
                self._prctl(PR_SCHED_CORE_SHARE_TO, to_pid)
            finally:
                self._prctl(PR_SCHED_CORE_SHARE_FROM, 0)  # pid 0: this thread; drops the cookie

    def clear(self, pid: int) -> None:
        with self._lock:
            self._prctl(PR_SCHED_CORE_SHARE_FROM, 0)
            self._prctl(PR_SCHED_CORE_SHARE_TO, pid)


def supported(ops: CookieOps) -> tuple[bool, str]:
    try:
        ops.get(os.getpid())
    except CookieError as exc:
        return False, f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror} (no CONFIG_SCHED_CORE?)"
    return True, ""


def pod_group(rule: CoreSchedRule, labels: Mapping[str, str], kube_qos: KubeQoS,
              uid: str) -> tuple[bool, str]:
    """Upstream's getPodEnabledAndGroup: (cookies on for the pod, its group id)."""
    qos = KoordQoS.of(labels)
    param = {KoordQoS.LSE: rule.lsr, KoordQoS.LSR: rule.lsr, KoordQoS.LS: rule.ls, KoordQoS.BE: rule.be}.get(qos)
    if param is None:  # no Koordinator class: by the kube QoS class
        param = {KubeQoS.BESTEFFORT: rule.be, KubeQoS.BURSTABLE: rule.ls}.get(
            kube_qos, rule.lsr if rule.lsr.enable else rule.ls)
    enabled = rule.enabled and param.enable
    group = labels.get(LABEL_CORE_SCHED_GROUP_ID, "")
    policy = labels.get(LABEL_CORE_SCHED_POLICY)
    if policy == "exclusive":
        group = uid
    elif policy == "none":
        enabled = False
    if rule.enabled and param.expeller:
        group += EXPELLER_SUFFIX
    return enabled, group


@dataclass
class _Group:
    cookie: int
    pids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Holder(Generic[K]):
    """One running container (or a pod's sandbox) found at warm-up: its group and processes."""

    group: str
    pids: list[int]
    key: K
    """The caller's name for the container, handed back with its cookie."""


class CookieManager:
    """Gives every process of an enabled container its group's cookie, and takes cookies
    away from processes of disabled ones. Thread-safe (hooks and reconciler).

    Until ``warmed``, the manager has not yet learnt which cookies the running pods' processes
    already hold (``warm_up``): a restarted koordlet then reuses a group's cookie instead of
    making a second one for the same group.
    """

    def __init__(self, ops: CookieOps) -> None:
        self.ops = ops
        self.groups: dict[str, _Group] = {}
        self.warmed = False
        self._lock = threading.Lock()

    def current_cookie(self, pids: list[int]) -> tuple[int, list[int]]:
        """Upstream's getCookie: the first cookie other than the default one that any of
        ``pids`` holds and the pids holding it; (0, []) when none does. Processes that
        cannot be asked (exited) are skipped; holders of a second cookie are left to the
        reconciler's rounds."""
        first, holders, seen = NO_COOKIE, [], set()
        for pid in pids:
            cookie = self._cookie(pid)
            if cookie is None or cookie == NO_COOKIE:
                continue
            seen.add(cookie)
            if first == NO_COOKIE:
                first = cookie
            if cookie == first:
                holders.append(pid)
        if len(seen) > 1:
            log.info("core scheduling: %d cookies among %d processes of one container; keeping %#x",
                     len(seen), len(pids), first)
        return first, holders

    def warm_up(self, containers: list[Holder[K]]) -> list[tuple[Holder[K], int]]:
        """Upstream's loadAllCookies: each group's cookie from the processes that hold one
        already. Warmed once any container had processes to ask (even if none holds a
        cookie); a container whose cookie differs from the one its group got first is left
        to the reconciler. Returns the containers adopted with their cookies."""
        adopted: list[tuple[Holder[K], int]] = []
        with self._lock:
            for holder in containers:
                if not holder.pids:
                    continue
                cookie, pids = self.current_cookie(holder.pids)
                self.warmed = True
                if cookie == NO_COOKIE:
                    continue
                group = self.groups.get(holder.group)
                if group is not None and group.cookie != cookie:
                    log.warning("core scheduling: group %r: cookie %#x at start, but %#x for another of its "
                                "containers; not adopted", holder.group, cookie, group.cookie)
                    continue
                if group is None:
                    self.groups[holder.group] = _Group(cookie, set(pids))
                else:
                    group.pids.update(pids)
                adopted.append((holder, cookie))
        return adopted

    def apply(self, enabled: bool, group: str, pids: list[int]) -> int:
        """Returns the cookie the processes now have (0: none)."""
        with self._lock:
            return self._enable(group, pids) if enabled else self._disable(pids)

    def _enable(self, group_id: str, pids: list[int]) -> int:
        if not pids:
            return NO_COOKIE
        group = self.groups.get(group_id)
        if group is not None:
            group.pids = {p for p in group.pids if self._cookie(p) == group.cookie}
            if not group.pids:  # every holder exited: the cookie is gone with them
                group = None
        if group is None:
            first = pids[0]
            group = self.groups[group_id] = _Group(self.ops.create(first), {first})
        source = next(iter(group.pids))
        for pid in pids:
            if pid in group.pids or self._cookie(pid) == group.cookie:
                group.pids.add(pid)
                continue
            try:
                self.ops.share(source, pid)
                group.pids.add(pid)
            except CookieError as exc:
                if exc.errno != errno.ESRCH:
                    raise
        return group.cookie

    def _disable(self, pids: list[int]) -> int:
        for pid in pids:
            if self._cookie(pid) != NO_COOKIE:
                try:
                    self.ops.clear(pid)
                except CookieError as exc:
                    if exc.errno != errno.ESRCH:
                        raise
            for group in self.groups.values():
                group.pids.discard(pid)
        return NO_COOKIE

    def _cookie(self, pid: int) -> int | None:
        try:
            return self.ops.get(pid)
        except CookieError:
            return None
