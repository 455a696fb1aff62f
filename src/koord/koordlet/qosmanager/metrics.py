"""Prometheus metrics of the QoS manager's decisions (upstream's ``koordlet_be_suppress_*``
and ``koordlet_pod_eviction`` names), registered on koordlet's registry so they are served
on ``--addr`` with the rest."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class QOSMetrics:
    def __init__(self, node: str = "", registry: CollectorRegistry | None = None) -> None:
        self.node = node
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.be_suppress_cores = Gauge(
            "koordlet_be_suppress_cpu_cores",
            "CPU BE pods were last suppressed to, in cores: the cpuset size (type=cpuset) or "
            "the besteffort quota / period (type=cfsQuota)", ["node", "type"], registry=r)
        self.be_suppress_ls_used = Gauge(
            "koordlet_be_suppress_ls_used_cpu_cores",
            "non-BE pods' CPU usage used in the last suppress calculation", ["node"], registry=r)
        self.be_suppress_target = Gauge(
            "koordlet_be_suppress_target_cpu_cores",
            "the suppress formula's last result before the policy's steps and minimums",
            ["node"], registry=r)
        self.evictions = Counter(
            "koordlet_pod_eviction", "pods evicted by the QoS manager, by reason",
            ["node", "reason"], registry=r)
        self.strategy_errors = Counter(
            "koordlet_qos_strategy_errors", "QoS strategy ticks that raised, by strategy",
            ["node", "strategy"], registry=r)
