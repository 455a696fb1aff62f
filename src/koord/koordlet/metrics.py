"""koordlet's Prometheus metrics (served on ``--addr`` with /healthz and /readyz).

Two registries, as upstream's: ``registry`` (internal: koordlet's own state and decisions,
``/internal-metrics``) and ``external`` (what koordlet measured and reported of the node and
its pods, ``/external-metrics``); ``/metrics`` serves both (``exposition.py``).

Names, types, labels and label values are upstream's where upstream has the metric
(docs/metrics.md lists them all); pod and container usage and module health are ours, in the
same style (``resource`` + ``unit`` labels, ``core`` and ``byte`` units). The report's gauges
hold what the last NodeMetric report computed (averages over the aggregate duration, the Prod
reclaimable), requests and limits the pods it saw: each report replaces them as a whole, so
pods that left disappear.

Those per-pod and per-container gauges are thousands of series on a busy node (four per
container), and each report replaces all of them: they are kept as the report's rows and
turned into samples when a page is scraped (``ReportGauges``), not as one
prometheus_client child (a lock, a value object, a label dict) per series, which cost
1.5 MiB and a burst of CPU per report at 100 pods.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from koord.apis.extension import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY
from koord.hookapi import HookPoint
from koord.hookapi.quantity import parse_quantity

from .exposition import WSGIApp, page
from .statesinformer.meta import PodMeta

log = logging.getLogger(__name__)

UNIT_CORE, UNIT_BYTE, UNIT_INTEGER = "core", "byte", "integer"
NODE_ALLOCATABLE = ((BATCH_CPU, UNIT_INTEGER), (BATCH_MEMORY, UNIT_BYTE),
                    (MID_CPU, UNIT_INTEGER), (MID_MEMORY, UNIT_BYTE))
"""The Node allocatable upstream exports: the batch and mid resources the slo-controller
sets (cpu in millicores, so ``integer``); one absent from the Node reads 0, as upstream's."""
STATUS_SUCCEEDED, STATUS_FAILED = "succeeded", "failed"
HOOK_BUCKETS_MS = tuple(0.01 * 4**i for i in range(8))
"""Upstream's buckets, 10 µs to 164 ms: a plugin function takes tens of µs, a cgroup write ~40 µs."""
PRIORITY_PROD = "koord-prod"
UPDATER_CGROUP, UPDATE_SUCCESS, UPDATE_FAILED = "cgroup", "success", "failed"
"""Upstream's resource updater type of a cgroup file and its update statuses (not the
``succeeded`` of the other histograms)."""
PREDICTED_RECLAIMABLE, PREDICTED_PEAK = "reclaimable", "peak"
"""What a predictor tells ``record_prediction`` it computed (``prediction.predictor``'s
``RECLAIMABLE`` and ``PEAK``), and the end of the gauge's name."""
KUBELET_BUCKETS_S = tuple(0.001 * 4**i for i in range(7))
"""Upstream's buckets, 1 ms to 4 s: a /pods answer takes milliseconds, the timeout is seconds."""
_NODE = ["node", "resource", "unit"]
_POD = ["node", "pod_uid", "pod_name", "pod_namespace"]
_CONTAINER = _POD + ["container_id", "container_name"]
Usage = tuple[float, float]
"""(cores, bytes)"""


def _add_usage(family: GaugeMetricFamily, labels: list[str], usage: Usage) -> None:
    """(cores, bytes) as the family's cpu and memory samples."""
    family.add_metric([*labels, "cpu", UNIT_CORE], usage[0])
    family.add_metric([*labels, "memory", UNIT_BYTE], usage[1])


@dataclass(frozen=True)
class ReportRows:
    """One NodeMetric report's numbers, as the gauges show them."""

    node: Usage | None = None
    system: Usage | None = None
    pods: Sequence[tuple[PodMeta, Usage]] = ()
    containers: Sequence[tuple[PodMeta, str, str, Usage]] = ()
    all_pods: Sequence[PodMeta] = ()
    numa: Sequence[tuple[int, Usage, Usage | None]] = ()
    """(NUMA node id, node usage, system usage)."""
    prod: tuple[Mapping[str, int] | None, Mapping[str, int] | None] | None = None
    """(Prod reclaimable: cpu millicores, memory bytes; None when unpredicted; the peak) when
    a predictor ran."""


class ReportGauges(PromCollector):
    """The gauges each NodeMetric report replaces: the report's rows, as samples at scrape
    time. ``update`` swaps them in one assignment, so a scrape sees one report or the next."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._report = ReportRows()

    def update(self, rows: ReportRows) -> None:
        self._report = rows

    def part(self, names: frozenset[str]) -> PromCollector:
        """A collector of this report's families named in ``names``: the report feeds both
        registries, each its own families."""
        return _ReportPart(self, names)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        (node_usage, system_usage, numa_node, numa_system, pod_usage, container_usage, requests, limits,
         reclaimable, reclaimable_status) = families
        r, node = self._report, [self.node]
        for family, usage in ((node_usage, r.node), (system_usage, r.system)):
            if usage is not None:
                _add_usage(family, node, usage)
        for numa_id, numa_usage, numa_system_usage in r.numa:
            _add_usage(numa_node, [self.node, str(numa_id)], numa_usage)
            if numa_system_usage is not None:
                _add_usage(numa_system, [self.node, str(numa_id)], numa_system_usage)
        for pod, usage in r.pods:
            _add_usage(pod_usage, [self.node, pod.uid, pod.name, pod.namespace], usage)
        for pod, cid, cname, usage in r.containers:
            _add_usage(container_usage, [self.node, pod.uid, pod.name, pod.namespace, cid, cname], usage)
        for pod in r.all_pods:
            for c in pod.containers:
                base = [self.node, pod.uid, pod.name, pod.namespace, c.id, c.name]
                for family, values in ((requests, c.requests), (limits, c.limits)):
                    for resource, amount in values.items():
                        if resource.endswith("cpu"):  # millicores: cores, as upstream exports them
                            family.add_metric([*base, resource, UNIT_CORE], amount / 1000)
                        else:
                            family.add_metric([*base, resource, UNIT_BYTE], amount)
        if r.prod is not None:  # upstream: 0 and status 1 when the prediction failed
            prod = r.prod[0] or {}
            _add_usage(reclaimable, [self.node, PRIORITY_PROD], (prod.get("cpu", 0) / 1000, prod.get("memory", 0)))
            reclaimable_status.add_metric([self.node, PRIORITY_PROD], 0 if r.prod[0] is not None else 1)
        yield from families

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        numa = ["node", "numa_node_id", "resource", "unit"]
        return (
            GaugeMetricFamily("koordlet_node_metric_node_usage",
                              "the node usage reported in the NodeMetric", labels=_NODE),
            GaugeMetricFamily("koordlet_node_metric_system_usage",
                              "the system usage reported in the NodeMetric", labels=_NODE),
            GaugeMetricFamily("koordlet_node_metric_numa_node_usage",
                              "the per-NUMA node usage reported in the NodeMetric", labels=numa),
            GaugeMetricFamily("koordlet_node_metric_numa_system_usage",
                              "the per-NUMA system usage reported in the NodeMetric", labels=numa),
            GaugeMetricFamily("koordlet_pod_resource_usage",
                              "pod usage reported in the NodeMetric (average over the aggregate duration)",
                              labels=_POD + ["resource", "unit"]),
            GaugeMetricFamily("koordlet_container_resource_usage",
                              "container usage, averaged as the pods' in the NodeMetric",
                              labels=_CONTAINER + ["resource", "unit"]),
            GaugeMetricFamily("koordlet_container_resource_requests",
                              "the container requests of resources", labels=_CONTAINER + ["resource", "unit"]),
            GaugeMetricFamily("koordlet_container_resource_limits",
                              "the container limits of resources", labels=_CONTAINER + ["resource", "unit"]),
            GaugeMetricFamily("koordlet_node_priority_resource_reclaimable",
                              "the Prod reclaimable resources reported in the NodeMetric (0 when unpredicted)",
                              labels=["node", "priority", "resource", "unit"]),
            GaugeMetricFamily("koordlet_node_resource_priority_reclaimable_status",
                              "0 when the reported Prod reclaimable was predicted, 1 when the prediction failed",
                              labels=["node", "priority"]),
        )


EXTERNAL_REPORT_FAMILIES = frozenset({
    "koordlet_container_resource_requests", "koordlet_container_resource_limits",
    "koordlet_node_priority_resource_reclaimable", "koordlet_node_resource_priority_reclaimable_status"})
"""The report's families upstream serves on /external-metrics (its resource summary)."""


class _ReportPart(PromCollector):
    def __init__(self, report: ReportGauges, names: frozenset[str]) -> None:
        self.report, self.names = report, names

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return (f for f in self.report.describe() if f.name in self.names)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return (f for f in self.report.collect() if f.name in self.names)


class KoordletMetrics:
    """All of koordlet's metrics, in registries of their own so tests can build several."""

    def __init__(self, node_name: str = "", registry: CollectorRegistry | None = None,
                 external: CollectorRegistry | None = None) -> None:
        self.node = node_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.external = external if external is not None else CollectorRegistry()
        r = self.registry
        self.start_time = Gauge("koordlet_start_time", "the start time of koordlet",
                                ["node"], registry=r)
        self.report = ReportGauges(node_name)
        internal_report = frozenset(f.name for f in self.report.describe()) - EXTERNAL_REPORT_FAMILIES
        r.register(self.report.part(internal_report))
        self.external.register(self.report.part(EXTERNAL_REPORT_FAMILIES))
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
        self.node_allocatable = Gauge("koordlet_node_resource_allocatable",
                                      "the node allocatable of resources updated by koordinator",
                                      ["node", "resource", "unit"], registry=self.external)
        self.reconciler_invoked = Histogram(
            "koordlet_runtime_hook_reconciler_invoked_duration_milliseconds",
            "time duration of invocations of runtime hook reconciler plugins",
            ["node", "level", "resource_type", "status"], buckets=HOOK_BUCKETS_MS, registry=r)
        self.resource_updates = Histogram(
            "koordlet_resource_update_duration_milliseconds", "time duration of resource update such as cgroup files",
            ["type", "status"], buckets=HOOK_BUCKETS_MS, registry=r)
        self._cgroup_update: dict[bool, Callable[[float], None]] = {}
        """Each status' series, bound at its first write: the executor observes every cgroup
        write, which must not look labels up each time (and a series written to never, as
        upstream's, is not served)."""
        self.predicted = {kind: Gauge(f"koordlet_node_predicted_resource_{kind}",
                                      f"the node {kind} resources predicted by koordinator",
                                      ["node", "predictor", "resource", "unit"], registry=r)
                          for kind in (PREDICTED_RECLAIMABLE, PREDICTED_PEAK)}
        self.kubelet_requests = Histogram(
            "koordlet_kubelet_request_duration_seconds", "kubelet HTTP requests, by verb, path and HTTP code",
            ["verb", "path", "code"], buckets=KUBELET_BUCKETS_S, registry=r)
        self.start_time.labels(node_name).set(time.time())

    def pages(self) -> dict[str, WSGIApp]:
        """Upstream's three metrics paths and the registries each serves."""
        return {"/metrics": page((self.registry, self.external)),
                "/internal-metrics": page((self.registry,)),
                "/external-metrics": page((self.external,))}

    def record_node_allocatable(self, node: Mapping | None) -> None:
        """The Node's batch and mid allocatable (rounded up to integers, as a Go Quantity's
        Value()); a Node without status.allocatable, or with one that cannot be read, is
        logged and leaves the last values."""
        allocatable = ((node or {}).get("status") or {}).get("allocatable")
        if not isinstance(allocatable, Mapping):
            return
        try:
            values = [(name, unit, math.ceil(parse_quantity(allocatable.get(name, 0))))
                      for name, unit in NODE_ALLOCATABLE]
        except ValueError as exc:
            log.warning("node %s: status.allocatable not exported: %s", self.node, exc)
            return
        for name, unit, value in values:
            self.node_allocatable.labels(self.node, name, unit).set(value)

    def set_module(self, module: str, up: bool) -> None:
        self.module_up.labels(self.node, module).set(1 if up else 0)

    def record_plugin_call(self, plugin: str, stage: HookPoint, ok: bool, seconds: float) -> None:
        self.runtime_hook_invoked.labels(self.node, plugin, stage.value,
                                         STATUS_SUCCEEDED if ok else STATUS_FAILED).observe(seconds * 1000)

    def record_reconciler_call(self, level: str, resource_types: Iterable[str], ok: bool, seconds: float) -> None:
        """One reconciler invocation at ``level`` (``kubeqos``, ``pod``, ``sandbox``,
        ``container``) that set ``resource_types`` (upstream's cgroup file names)."""
        status = STATUS_SUCCEEDED if ok else STATUS_FAILED
        for resource_type in resource_types:
            self.reconciler_invoked.labels(self.node, level, resource_type, status).observe(seconds * 1000)

    def record_cgroup_update(self, ok: bool, seconds: float) -> None:
        """One cgroup file write of the resource executor."""
        observe = self._cgroup_update.get(ok)
        if observe is None:
            series = self.resource_updates.labels(UPDATER_CGROUP, UPDATE_SUCCESS if ok else UPDATE_FAILED)
            observe = self._cgroup_update[ok] = series.observe
        observe(seconds * 1000)

    def record_prediction(self, kind: str, predictor: str, resources: Mapping[str, int]) -> None:
        """A predictor's result (``reclaimable``) or peak: cpu millicores as cores, memory bytes."""
        gauge = self.predicted[kind]
        gauge.labels(self.node, predictor, "cpu", UNIT_CORE).set(resources["cpu"] / 1000)
        gauge.labels(self.node, predictor, "memory", UNIT_BYTE).set(resources["memory"])

    def record_kubelet_request(self, verb: str, path: str, code: int, seconds: float) -> None:
        self.kubelet_requests.labels(verb, path, str(code)).observe(seconds)

    def record_hook_request(self, stage: HookPoint, code: grpc.StatusCode) -> None:
        self.runtime_hook_requests.labels(self.node, stage.value, code.name).inc()

    def record_report(self, ok: bool) -> None:
        self.node_metric_reports.labels(self.node, STATUS_SUCCEEDED if ok else "failed").set(time.time())

    def record_report_rows(self, rows: ReportRows) -> None:
        """Replaces every series the report feeds (usage of the node, its NUMA nodes, pods and
        containers, requests and limits of every pod's containers, the Prod reclaimable)."""
        self.report.update(rows)
