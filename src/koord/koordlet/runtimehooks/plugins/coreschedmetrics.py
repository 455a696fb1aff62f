"""Prometheus metrics of CoreSched's cookies, upstream's names and labels:

- ``koordlet_container_core_sched_cookie`` {node, pod_name, pod_namespace, pod_uid,
  container_name, container_id, core_sched_group, core_sched_cookie}: 1 for the cookie each
  container's processes hold (the series goes when the container's cookie is cleared, its
  group or cookie changes, the container restarts under a new id, or its pod stops);
- ``koordlet_core_sched_cookie_manage_status`` {node, core_sched_group, status}: a counter
  of cookie operations per group, ``succeeded`` or ``failed`` (the Python client exposes a
  counter with the ``_total`` suffix).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

SUCCEEDED, FAILED = "succeeded", "failed"


@dataclass(frozen=True)
class CookieHolder:
    """One container whose processes hold a group's cookie."""

    pod_namespace: str
    pod_name: str
    pod_uid: str
    container_name: str
    container_id: str

    @property
    def slot(self) -> tuple[str, str]:
        """What a restarted container (a new id) keeps: its pod and its name."""
        return self.pod_uid, self.container_name


class CoreSchedMetrics:
    def __init__(self, node: str = "", registry: CollectorRegistry | None = None) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self.container_cookie = Gauge(
            "koordlet_container_core_sched_cookie", "the core scheduling cookie of the container",
            ["node", "pod_name", "pod_namespace", "pod_uid", "container_name", "container_id",
             "core_sched_group", "core_sched_cookie"], registry=self.registry)
        self.manage_status = Counter(
            "koordlet_core_sched_cookie_manage_status", "the manage status of the core scheduling cookie",
            ["node", "core_sched_group", "status"], registry=self.registry)
        self._series: dict[tuple[str, str], tuple[str, ...]] = {}
        """(pod uid, container name; "" for the sandbox) -> the container's current series, so a
        changed group, cookie or container id replaces it."""
        self._lock = threading.Lock()

    def record_cookie(self, holder: CookieHolder, group: str, cookie: int) -> None:
        labels = (self.node, holder.pod_name, holder.pod_namespace, holder.pod_uid, holder.container_name,
                  holder.container_id, group, str(cookie))
        with self._lock:
            last = self._series.get(holder.slot)
            if last == labels:
                return
            if last is not None:
                self.container_cookie.remove(*last)
            self._series[holder.slot] = labels
            self.container_cookie.labels(*labels).set(1)

    def reset_cookie(self, holder: CookieHolder) -> None:
        with self._lock:
            last = self._series.pop(holder.slot, None)
            if last is not None:
                self.container_cookie.remove(*last)

    def forget_pod(self, pod_uid: str) -> None:
        """The pod stopped: its containers' series go."""
        with self._lock:
            for slot in [s for s in self._series if s[0] == pod_uid]:
                self.container_cookie.remove(*self._series.pop(slot))

    def record_status(self, group: str, succeeded: bool) -> None:
        self.manage_status.labels(self.node, group, SUCCEEDED if succeeded else FAILED).inc()
