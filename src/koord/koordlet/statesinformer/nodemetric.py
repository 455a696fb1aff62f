"""The NodeMetric status koordlet reports: usage from the metric cache, in upstream's JSON.

``build_status`` is a pure function of the metric cache, the pods, the collect policy and
the NodeSLO at one instant, so every rule below is tested as a table:

- ``nodeMetric.nodeUsage`` / ``systemUsage``: averages over the aggregate duration, and
  per NUMA node (``numaUsages``, sorted by id) where the advisor knows the NUMA nodes;
- ``aggregatedNodeUsages`` / ``aggregatedSystemUsages``: per window, avg and p50..p99,
  each map empty while the samples span less than half the window (cold start);
- ``podsMetric``: the average of each pod with samples, with its priority class and QoS,
  sorted by namespace and name; ``hostApplicationMetric`` for NodeSLO host applications;
- memory follows ``nodeMemoryCollectPolicy`` (hot page cache falls back to "without page
  cache": no cold-memory collector runs); system usage ignores it, as upstream does.

Quantities are Kubernetes' canonical strings: cpu as milli-cores ("1500m", "2"), memory
as bytes in the binary format ("200Mi", "1536").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..metriccache import (
    CONTAINER_CPU_USAGE,
    CONTAINER_ID,
    CONTAINER_MEMORY_USAGE,
    CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE,
    HOST_APP_NAME,
    HOST_APPLICATION_CPU_USAGE,
    HOST_APPLICATION_MEMORY_USAGE,
    HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE,
    NODE_CPU_USAGE,
    NODE_MEMORY_USAGE,
    NODE_MEMORY_USAGE_WITH_PAGE_CACHE,
    NODE_NUMA_CPU_USAGE,
    NODE_NUMA_INFO,
    NODE_NUMA_MEMORY_USAGE,
    NUMA_NODE_ID,
    POD_CPU_USAGE,
    POD_MEMORY_USAGE,
    POD_MEMORY_USAGE_WITH_PAGE_CACHE,
    POD_UID,
    SYS_CPU_USAGE,
    SYS_MEMORY_USAGE,
    SYS_NUMA_CPU_USAGE,
    SYS_NUMA_MEMORY_USAGE,
    Aggregation,
)
from ..rfc3339 import format_time
from ..slo import HostApp
from .meta import PodMeta
from .specs import format_go_duration

log = logging.getLogger(__name__)

COLD_START_RATIO = 0.5
"""A window is reported only when its samples span at least this share of it."""

WINDOW_AGGREGATIONS = (("avg", Aggregation.AVG), ("p50", Aggregation.P50),
                       ("p90", Aggregation.P90), ("p95", Aggregation.P95),
                       ("p99", Aggregation.P99))


class MetricQuerier(Protocol):
    def aggregate(self, kind: str, start: float, end: float, agg: Aggregation,
                  labels: dict[str, str] | None = None) -> float | None: ...

    def aggregates(self, kind: str, start: float, end: float, aggs: Iterable[Aggregation],
                   labels: dict[str, str] | None = None) -> dict[Aggregation, float]: ...

    def aggregate_by(self, kind: str, label: str, start: float, end: float,
                     aggs: Iterable[Aggregation]) -> dict[str, dict[Aggregation, float]]: ...

    def time_range(self, kind: str, start: float, end: float,
                   labels: dict[str, str] | None = None) -> float: ...

    def get_kv(self, key: str) -> Any | None: ...


Resources = dict[str, int]
"""{"cpu": milli-cores, "memory": bytes}."""


class ProdPredictor(Protocol):
    """The peak predictor of one report (``koord.koordlet.prediction``)."""

    def add_pod(self, pod: PodMeta) -> None: ...

    def report(self) -> tuple[Resources | None, Resources | None]: ...


# ---- quantities ------------------------------------------------------------------------

_DECIMAL_SUFFIXES = ("m", "", "k", "M", "G", "T", "P", "E")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def cpu_quantity(milli: int) -> str:
    """Kubernetes' canonical DecimalSI form of a milli value: 1500 -> "1500m", 2000 -> "2"."""
    if milli == 0:
        return "0"
    value, index = milli, 0
    while value % 1000 == 0 and index < len(_DECIMAL_SUFFIXES) - 1:
        value, index = value // 1000, index + 1
    return f"{value}{_DECIMAL_SUFFIXES[index]}"


def memory_quantity(n_bytes: int) -> str:
    """Kubernetes' canonical BinarySI form: 209715200 -> "200Mi", 1536 -> "1536"."""
    if -1024 < n_bytes < 1024:
        return str(n_bytes)
    value, index = n_bytes, 0
    while value % 1024 == 0 and index < len(_BINARY_SUFFIXES) - 1:
        value, index = value // 1024, index + 1
    return f"{value}{_BINARY_SUFFIXES[index]}"


def resource_map(cores: float, n_bytes: float) -> dict[str, Any]:
    """upstream's ResourceMap: cpu = int(cores * 1000) milli, memory = int(bytes)."""
    return resource_map_of({"cpu": int(cores * 1000), "memory": int(n_bytes)})


def resource_map_of(resources: Resources) -> dict[str, Any]:
    """ResourceMap of exact integers: cpu milli-cores, memory bytes."""
    return {"resources": {"cpu": cpu_quantity(resources["cpu"]),
                          "memory": memory_quantity(resources["memory"])}}


# ---- classes ---------------------------------------------------------------------------

_QOS_OF_KUBE_QOS = {"guaranteed": "LSR", "burstable": "LS", "besteffort": "BE"}
_PRIORITY_RANGES = (("koord-prod", 9000, 9999), ("koord-mid", 7000, 7999),
                    ("koord-batch", 5000, 5999), ("koord-free", 3000, 3999))


def qos_with_default(pod: PodMeta) -> str:
    """The pod's Koordinator QoS, else the one its kube QoS implies (as upstream)."""
    return pod.koord_qos.value or _QOS_OF_KUBE_QOS.get(pod.kube_qos, "")


def priority_class_with_default(pod: PodMeta) -> str:
    """koord-prod/mid/batch/free by the pod's priority value, else by its QoS."""
    if pod.priority is not None:
        for name, low, high in _PRIORITY_RANGES:
            if low <= pod.priority <= high:
                return name
    qos = qos_with_default(pod)
    if qos in ("SYSTEM", "LSE", "LSR", "LS"):
        return "koord-prod"
    if qos == "BE":
        return "koord-batch"
    return ""


# ---- status ----------------------------------------------------------------------------

def memory_kinds(policy: str) -> tuple[str, str, str, str]:
    """(node, pod, container, host app) memory kinds for a nodeMemoryCollectPolicy."""
    if policy == "usageWithPageCache":
        return (NODE_MEMORY_USAGE_WITH_PAGE_CACHE, POD_MEMORY_USAGE_WITH_PAGE_CACHE,
                CONTAINER_MEMORY_USAGE_WITH_PAGE_CACHE, HOST_APPLICATION_MEMORY_USAGE_WITH_PAGE_CACHE)
    return NODE_MEMORY_USAGE, POD_MEMORY_USAGE, CONTAINER_MEMORY_USAGE, HOST_APPLICATION_MEMORY_USAGE


def in_cold_start(start: float, end: float, sample_span: float) -> bool:
    return sample_span < (end - start) * COLD_START_RATIO


def usage(cache: MetricQuerier, cpu_kind: str, memory_kind: str, start: float, end: float,
          agg: Aggregation, labels: dict[str, str] | None = None) -> tuple[float, float] | None:
    """(cores, bytes) aggregated over [start, end]; None when either has no sample."""
    cpu = cache.aggregate(cpu_kind, start, end, agg, labels)
    memory = cache.aggregate(memory_kind, start, end, agg, labels)
    if cpu is None or memory is None:
        return None
    return cpu, memory


Usage = tuple[float, float]
"""(cores, bytes)."""


@dataclass
class Report:
    """One report's numbers before formatting; Prometheus shows the same numbers."""

    end: float
    node: Usage | None = None
    node_windows: list[tuple[float, dict[str, Usage | None]]] = field(default_factory=list)
    system: Usage | None = None
    system_windows: list[tuple[float, dict[str, Usage | None]]] = field(default_factory=list)
    pods: list[tuple[PodMeta, Usage]] = field(default_factory=list)
    containers: list[tuple[PodMeta, str, str, Usage]] = field(default_factory=list)
    host_apps: list[tuple[HostApp, Usage]] = field(default_factory=list)
    numa: list[tuple[int, Usage, Usage | None]] = field(default_factory=list)
    """(NUMA node id, node usage, system usage)."""
    prod: tuple[Resources | None, Resources | None] | None = None
    """(Prod reclaimable, Prod peak) when a predictor ran; None inside when unpredicted."""


def windows(cache: MetricQuerier, cpu_kind: str, memory_kind: str, end: float,
            durations: Iterable[float]) -> list[tuple[float, dict[str, Usage | None]]]:
    """Per window: each aggregation, None while in cold start or without samples. Every
    aggregation of a window comes from one query per kind."""
    out: list[tuple[float, dict[str, Usage | None]]] = []
    aggs = [agg for _, agg in WINDOW_AGGREGATIONS]
    for d in durations:
        start = end - d
        if in_cold_start(start, end, cache.time_range(cpu_kind, start, end)):
            out.append((d, dict.fromkeys((name for name, _ in WINDOW_AGGREGATIONS), None)))
            continue
        cpu = cache.aggregates(cpu_kind, start, end, aggs)
        memory = cache.aggregates(memory_kind, start, end, aggs)
        out.append((d, {name: (cpu[agg], memory[agg]) if agg in cpu and agg in memory else None
                        for name, agg in WINDOW_AGGREGATIONS}))
    return out


def averages_by(cache: MetricQuerier, cpu_kind: str, memory_kind: str, label: str,
                start: float, end: float) -> dict[str, Usage]:
    """(cores, bytes) averages per value of ``label`` that has both, from one pass per kind
    over all series (the report covers every pod and container of the node at once)."""
    cpu = cache.aggregate_by(cpu_kind, label, start, end, (Aggregation.AVG,))
    memory = cache.aggregate_by(memory_kind, label, start, end, (Aggregation.AVG,))
    return {value: (c[Aggregation.AVG], memory[value][Aggregation.AVG])
            for value, c in cpu.items() if Aggregation.AVG in c
            and Aggregation.AVG in memory.get(value, {})}


def collect(cache: MetricQuerier, pods: Iterable[PodMeta], policy: dict[str, Any],
            host_apps: Iterable[HostApp] = (), now: float | None = None,
            predictor: ProdPredictor | None = None) -> Report:
    """Everything a report needs, for ``policy`` (a merged ``metricCollectPolicy``) and the
    NodeSLO's ``host_apps``; the predictor sees the pods with samples in the window, as
    upstream's."""
    end = time.time() if now is None else now
    start = end - policy["aggregateDurationSeconds"]
    node_mem, pod_mem, container_mem, app_mem = memory_kinds(policy["nodeMemoryCollectPolicy"])
    durations = policy["durations"]
    report = Report(
        end=end,
        node=usage(cache, NODE_CPU_USAGE, node_mem, start, end, Aggregation.AVG),
        node_windows=windows(cache, NODE_CPU_USAGE, node_mem, end, durations),
        system=usage(cache, SYS_CPU_USAGE, SYS_MEMORY_USAGE, start, end, Aggregation.AVG),
        system_windows=windows(cache, SYS_CPU_USAGE, SYS_MEMORY_USAGE, end, durations))
    pods_used = averages_by(cache, POD_CPU_USAGE, pod_mem, POD_UID, start, end)
    containers_used = averages_by(cache, CONTAINER_CPU_USAGE, container_mem, CONTAINER_ID, start, end)
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name, p.uid)):
        found = pods_used.get(pod.uid)
        if found is None:
            log.debug("NodeMetric: pod %s has no samples in the last %ss", pod.key,
                      policy["aggregateDurationSeconds"])
            continue
        report.pods.append((pod, found))
        if predictor is not None:
            try:
                predictor.add_pod(pod)
            except Exception as exc:  # noqa: BLE001 - a pod without a model yet: logged, not fatal
                log.debug("NodeMetric: predictor: pod %s: %s", pod.key, exc)
        for c in pod.containers:
            cu = containers_used.get(c.id)
            if cu is not None:
                report.containers.append((pod, c.id, c.name, cu))
    for app in host_apps:
        found = usage(cache, HOST_APPLICATION_CPU_USAGE, app_mem, start, end, Aggregation.AVG,
                      {HOST_APP_NAME: app.name})
        if found is not None:
            report.host_apps.append((app, found))
    report.host_apps.sort(key=lambda a: a[0].name)
    if predictor is not None:
        report.prod = predictor.report()
    for numa_id in numa_node_ids(cache):
        labels = {NUMA_NODE_ID: str(numa_id)}
        node = usage(cache, NODE_NUMA_CPU_USAGE, NODE_NUMA_MEMORY_USAGE, start, end, Aggregation.AVG, labels)
        if node is not None:
            system = usage(cache, SYS_NUMA_CPU_USAGE, SYS_NUMA_MEMORY_USAGE, start, end, Aggregation.AVG, labels)
            report.numa.append((numa_id, node, system))
    return report


def numa_node_ids(cache: MetricQuerier) -> list[int]:
    """NUMA node ids from the node info the advisor stores; [] when unknown or malformed."""
    info = cache.get_kv(NODE_NUMA_INFO)
    nodes = info.get("nodes") if isinstance(info, dict) else None
    if not isinstance(nodes, list):
        return []
    return sorted({n["id"] for n in nodes
                   if isinstance(n, dict) and isinstance(n.get("id"), int) and not isinstance(n["id"], bool)})


def _map(found: Usage | None) -> dict[str, Any]:
    return {} if found is None else resource_map(*found)


def _windows_json(ws: list[tuple[float, dict[str, Usage | None]]]) -> list[dict[str, Any]]:
    return [{"usage": {name: _map(u) for name, u in by_agg.items()},
             "duration": format_go_duration(d)} for d, by_agg in ws]


def update_time(now: float) -> str:
    """metav1.Time: RFC 3339 in UTC, whole seconds."""
    return format_time(now)


def status_of(report: Report) -> dict[str, Any]:
    """The NodeMetric ``status`` in upstream's JSON field names."""
    pods_metric = []
    for pod, found in report.pods:
        metric: dict[str, Any] = {"namespace": pod.namespace, "name": pod.name,
                                  "podUsage": resource_map(*found)}
        priority, qos = priority_class_with_default(pod), qos_with_default(pod)
        if priority:
            metric["priority"] = priority
        if qos:
            metric["qos"] = qos
        pods_metric.append(metric)
    status: dict[str, Any] = {
        "updateTime": update_time(report.end),
        "nodeMetric": {"nodeUsage": _map(report.node),
                       "aggregatedNodeUsages": _windows_json(report.node_windows),
                       "systemUsage": _map(report.system),
                       "aggregatedSystemUsages": _windows_json(report.system_windows)},
        "podsMetric": pods_metric,
    }
    if report.numa:
        status["nodeMetric"]["numaUsages"] = [
            {"numaNodeID": numa_id, "nodeUsage": resource_map(*node), "systemUsage": _map(system)}
            for numa_id, node, system in report.numa]
    if report.prod is not None:
        reclaimable, peak = report.prod
        # upstream: an empty resource when unpredicted; the peak only when predicted
        status["prodReclaimableMetric"] = {"resource": {} if reclaimable is None
                                           else resource_map_of(reclaimable)}
        if peak is not None:
            status["prodPeakMetric"] = {"resource": resource_map_of(peak)}
    if report.host_apps:
        status["hostApplicationMetric"] = [
            {"name": app.name, "usage": resource_map(*found),
             **{k: v for k, v in (("priority", app.priority), ("qos", app.qos)) if v}}
            for app, found in report.host_apps]
    return status


def build_status(cache: MetricQuerier, pods: Iterable[PodMeta], policy: dict[str, Any],
                 host_apps: Iterable[HostApp] = (), now: float | None = None,
                 predictor: ProdPredictor | None = None) -> dict[str, Any]:
    return status_of(collect(cache, pods, policy, host_apps, now, predictor))
