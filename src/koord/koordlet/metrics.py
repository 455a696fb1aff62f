"""koordlet's Prometheus metrics (served on ``--addr`` with /healthz and /readyz).

Names follow upstream's ``koordlet_*`` metrics where upstream has one
(``koordlet_start_time``, ``koordlet_node_metric_node_usage``,
``koordlet_node_metric_system_usage``, ``koordlet_container_resource_requests`` /
``_limits``); pod and container usage and module health are ours, in the same style
(``resource`` + ``unit`` labels, ``core`` and ``byte`` units). Usage gauges hold what the
last NodeMetric report computed (averages over the aggregate duration) and are rebuilt
from scratch on each report, so pods that left disappear.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from koord.hookapi import HookPoint

from .statesinformer.meta import PodMeta

UNIT_CORE, UNIT_BYTE = "core", "byte"
STATUS_SUCCEED, STATUS_FAILED = "succeed", "failed"
HOOK_BUCKETS_MS = tuple(0.01 * 4**i for i in range(8))
"""Upstream's buckets, 10 µs to 164 ms: a plugin function takes tens of µs, a cgroup write ~40 µs."""
_POD = ["node", "pod_uid", "pod_name", "pod_namespace"]
_CONTAINER = _POD + ["container_id", "container_name"]


class KoordletMetrics:
    """All gauges, in a registry of their own so tests can build several."""

    def __init__(self, node_name: str = "", registry: CollectorRegistry | None = None) -> None:
        self.node = node_name
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.start_time = Gauge("koordlet_start_time", "the start time of koordlet",
                                ["node"], registry=r)
        self.node_usage = Gauge("koordlet_node_metric_node_usage",
                                "the node usage reported in the NodeMetric",
                                ["node", "resource", "unit"], registry=r)
        self.system_usage = Gauge("koordlet_node_metric_system_usage",
                                  "the system usage reported in the NodeMetric",
                                  ["node", "resource", "unit"], registry=r)
        self.pod_usage = Gauge("koordlet_pod_resource_usage",
                               "pod usage reported in the NodeMetric (average over the "
                               "aggregate duration)", _POD + ["resource", "unit"], registry=r)
        self.container_usage = Gauge("koordlet_container_resource_usage",
                                     "container usage, averaged as the pods' in the NodeMetric",
                                     _CONTAINER + ["resource", "unit"], registry=r)
        self.container_requests = Gauge("koordlet_container_resource_requests",
                                        "the container requests of resources",
                                        _CONTAINER + ["resource", "unit"], registry=r)
        self.container_limits = Gauge("koordlet_container_resource_limits",
                                      "the container limits of resources",
                                      _CONTAINER + ["resource", "unit"], registry=r)
        self.module_up = Gauge("koordlet_module_up",
                               "1 when the koordlet module started and runs, 0 when it could not",
                               ["node", "module"], registry=r)
        self.node_metric_reports = Gauge("koordlet_node_metric_last_report_timestamp_seconds",
                                         "when the NodeMetric status was last written, by outcome",
                                         ["node", "status"], registry=r)
        self.runtime_hook_invoked = Histogram(
            "koordlet_runtime_hook_invoked_duration_milliseconds",
            "time duration of invocations of runtime hook plugins", ["node", "hook", "stage", "status"],
            buckets=HOOK_BUCKETS_MS, registry=r)
        self.runtime_hook_requests = Counter(
            "koordlet_runtime_hook_requests",
            "hook calls answered by koordlet's hook server, by gRPC status (INVALID_ARGUMENT: a request "
            "or annotation koordlet refused)", ["node", "stage", "code"], registry=r)
        self.start_time.labels(node_name).set(time.time())

    def set_module(self, module: str, up: bool) -> None:
        self.module_up.labels(self.node, module).set(1 if up else 0)

    def record_plugin_call(self, plugin: str, stage: HookPoint, ok: bool, seconds: float) -> None:
        self.runtime_hook_invoked.labels(self.node, plugin, stage.value,
                                         STATUS_SUCCEED if ok else STATUS_FAILED).observe(seconds * 1000)

    def record_hook_request(self, stage: HookPoint, code: grpc.StatusCode) -> None:
        self.runtime_hook_requests.labels(self.node, stage.value, code.name).inc()

    def record_report(self, ok: bool) -> None:
        self.node_metric_reports.labels(self.node, "succeeded" if ok else "failed").set(time.time())

    def record_usage(self, node: tuple[float, float] | None, system: tuple[float, float] | None,
                     pods: Iterable[tuple[PodMeta, tuple[float, float]]],
                     containers: Iterable[tuple[PodMeta, str, str, tuple[float, float]]]) -> None:
        """Replaces every usage series with this report's (cores, bytes) values."""
        for gauge, value in ((self.node_usage, node), (self.system_usage, system)):
            gauge.clear()
            if value is not None:
                gauge.labels(self.node, "cpu", UNIT_CORE).set(value[0])
                gauge.labels(self.node, "memory", UNIT_BYTE).set(value[1])
        self.pod_usage.clear()
        for pod, (cores, n_bytes) in pods:
            base = (self.node, pod.uid, pod.name, pod.namespace)
            self.pod_usage.labels(*base, "cpu", UNIT_CORE).set(cores)
            self.pod_usage.labels(*base, "memory", UNIT_BYTE).set(n_bytes)
        self.container_usage.clear()
        for pod, cid, cname, (cores, n_bytes) in containers:
            labels = (self.node, pod.uid, pod.name, pod.namespace, cid, cname)
            self.container_usage.labels(*labels, "cpu", UNIT_CORE).set(cores)
            self.container_usage.labels(*labels, "memory", UNIT_BYTE).set(n_bytes)

    def record_pods(self, pods: Iterable[PodMeta]) -> None:
        """Requests and limits of every container (cpu in cores, memory in bytes)."""
        self.container_requests.clear()
        self.container_limits.clear()
        for pod in pods:
            for c in pod.containers:
                base = (self.node, pod.uid, pod.name, pod.namespace, c.id, c.name)
                for gauge, values in ((self.container_requests, c.requests),
                                      (self.container_limits, c.limits)):
                    for resource, value in values.items():
                        if resource.endswith("cpu"):
                            gauge.labels(*base, resource, UNIT_CORE).set(value / 1000)
                        else:
                            gauge.labels(*base, resource, UNIT_BYTE).set(value)
