"""Prometheus metrics of the QoS manager's decisions (upstream's ``koordlet_be_suppress_*``
and ``koordlet_pod_eviction`` names), registered on koordlet's registry so they are served
on ``--addr`` with the rest."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge


class TickGauge:
    """A labelled gauge that shows what one strategy tick set: series not set again by the
    end of a tick are removed. Each label set's child is looked up once (``labels()``
    validates its arguments on every call; CPU burst sets one per container every second)."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._children: dict[tuple[str, ...], Gauge] = {}
        self._set: set[tuple[str, ...]] = set()

    def begin(self) -> None:
        self._set = set()

    def set(self, labels: tuple[str, ...], value: float) -> None:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self.gauge.labels(*labels)
        child.set(value)
        self._set.add(labels)

    def keep(self, series: Iterable[tuple[str, ...]]) -> None:
        """These series stay as a tick before set them: their strategy skipped work that
        would set the same values again."""
        self._set.update(series)

    def end(self) -> None:
        for labels in [k for k in self._children if k not in self._set]:
            del self._children[labels]
            self.gauge.remove(*labels)


EVICTION_DETAIL_EXPIRE_SECONDS = 300.0
"""As upstream's expiring counter: a pod's ``koordlet_pod_eviction_detail`` series goes
this long after its last eviction (pods come and go; their series must not pile up)."""


class QOSMetrics:
    def __init__(self, node: str = "", registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self._clock = clock
        self._detail_lock = threading.Lock()
        self._detail_at: dict[tuple[str, ...], float] = {}
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.be_suppress_cores = Gauge(
            "koordlet_be_suppress_cpu_cores",
            "CPU BE pods were last suppressed to, in cores: the cpuset size (type=cpuset) or "
            "the besteffort quota / period (type=cfsQuota)", ["node", "type"], registry=r)
        self.be_suppress_ls_used = Gauge(
            "koordlet_be_suppress_ls_used_cpu_cores",
            "non-BE pods' CPU usage used in the last suppress calculation", ["node"], registry=r)
        self.be_suppress_be_used = Gauge(
            "koordlet_be_suppress_be_used_cpu_cores",
            "BE pods' CPU usage in the last suppress calculation", ["node"], registry=r)
        self.be_suppress_target = Gauge(
            "koordlet_be_suppress_target_cpu_cores",
            "the suppress formula's last result before the policy's steps and minimums",
            ["node"], registry=r)
        self.evictions = Counter(
            "koordlet_pod_eviction", "Number of eviction launched by koordlet",
            ["node", "reason"], registry=r)
        self.eviction_detail = Counter(
            "koordlet_pod_eviction_detail", "evict detail launched by koordlet",
            ["node", "pod_namespace", "pod_name", "reason"], registry=r)
        container = ["node", "pod_namespace", "pod_name", "container_id", "container_name"]
        self.container_scaled_cfs_burst = TickGauge(Gauge(
            "koordlet_container_scaled_cfs_burst_us",
            "The maximum accumulated run-time (in microseconds) in container-level set by koordlet",
            container, registry=r))
        self.container_scaled_cfs_quota = TickGauge(Gauge(
            "koordlet_container_scaled_cfs_quota_us",
            "Run-time replenished within a period (in microseconds) in container-level set by koordlet",
            container, registry=r))
        self.cpu_burst_share_pool = Gauge(
            "koordlet_cpu_burst_share_pool_usage_ratio",
            "CPUBurst's last share-pool usage / share-pool cpus (quotas rise below its threshold)",
            ["node"], registry=r)
        self.strategy_errors = Counter(
            "koordlet_qos_strategy_errors", "QoS strategy ticks that raised, by strategy",
            ["node", "strategy"], registry=r)

    def record_eviction(self, namespace: str, name: str, reason: str) -> None:
        self.evictions.labels(self.node, reason).inc()
        labels = (self.node, namespace, name, reason)
        self.eviction_detail.labels(*labels).inc()
        with self._detail_lock:
            self._detail_at[labels] = self._clock()
        self.expire_eviction_detail()

    def expire_eviction_detail(self) -> None:
        """Removes the detail series not incremented in the last 5 minutes; the eviction
        strategies call it every tick."""
        now = self._clock()
        with self._detail_lock:
            for labels in [k for k, t in self._detail_at.items() if now - t >= EVICTION_DETAIL_EXPIRE_SECONDS]:
                del self._detail_at[labels]
                self.eviction_detail.remove(*labels)

    def begin_cpu_burst(self) -> None:
        """Each CPUBurst tick reports only the containers it handled (gone ones vanish at
        ``end_cpu_burst``)."""
        self.container_scaled_cfs_burst.begin()
        self.container_scaled_cfs_quota.begin()

    def end_cpu_burst(self) -> None:
        self.container_scaled_cfs_burst.end()
        self.container_scaled_cfs_quota.end()
