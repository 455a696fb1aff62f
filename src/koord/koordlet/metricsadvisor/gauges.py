"""Upstream's gauges of what the PSI and host-application collectors read each tick.

Upstream resets these gauges at every tick of their collector and sets one series per pod,
container or app it read, so a pod that left or an app NodeSLO no longer names is gone from
the next tick. Here each collector's tick leaves its rows in ``SharedState`` (one
assignment) and these collectors turn them into samples when a page is scraped, as the
NodeMetric report's gauges are (``koordlet.metrics.ReportGauges``): a node of a hundred pods
has thousands of PSI series (up to eighteen a pod or container), which would otherwise be as
many client-library children made and dropped every tick.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector as PromCollector

from .framework import SharedState
from .parsers import PSI_WINDOWS

_POD = ["node", "pod_uid", "pod_name", "pod_namespace"]
_PSI = ["psi_resource_type", "psi_precision", "psi_degree", "cpu_full_supported"]


class PSIGauges(PromCollector):
    """``koordlet_pod_psi`` and ``koordlet_container_psi`` (upstream's /external-metrics):
    per resource (``cpu``, ``mem``, ``io``) the ``some`` degree's avg10, avg60 and avg300
    and, where the file has a ``full`` line, the ``full`` degree's; ``cpu_full_supported``
    says whether that resource's file had one (upstream's label, despite its name, is the
    resource's own)."""

    def __init__(self, shared: SharedState, node: str) -> None:
        self.shared, self.node = shared, node

    @staticmethod
    def describe() -> Iterator[GaugeMetricFamily]:
        """Both families, empty."""
        yield GaugeMetricFamily("koordlet_container_psi", "Container psi collected by koordlet",
                                labels=[*_POD, "container_id", "container_name", *_PSI])
        yield GaugeMetricFamily("koordlet_pod_psi", "Pod psi collected by koordlet", labels=[*_POD, *_PSI])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        containers, pods = self.describe()
        for target, found in self.shared.psi:
            pod, container = target.pod, target.container
            base = [self.node, pod.uid, pod.name, pod.namespace]
            family = pods
            if container is not None:
                base += [container.id, container.name]
                family = containers
            for resource, degrees in found:
                full = "true" if "full" in degrees else "false"
                for degree, averages in degrees.items():
                    for window, value in zip(PSI_WINDOWS, averages, strict=True):
                        family.add_metric([*base, resource, window, degree, full], value)
        yield containers
        yield pods


class HostAppGauges(PromCollector):
    """``koordlet_host_application_resource_usage`` (upstream's /internal-metrics): each
    NodeSLO host application's CPU (cores) and memory (bytes, without page cache) of the
    collector's last tick, with the app's priority and QoS classes as NodeSLO gives them
    (empty when not given)."""

    def __init__(self, shared: SharedState, node: str) -> None:
        self.shared, self.node = shared, node

    @staticmethod
    def describe() -> Iterator[GaugeMetricFamily]:
        """The family, empty."""
        yield GaugeMetricFamily("koordlet_host_application_resource_usage",
                                "Host application resource usage collected by koordlet",
                                labels=["node", "host_application_name", "resource", "priority_class", "qos"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        (usage,) = self.describe()
        for name, priority, qos, cpu, memory in self.shared.host_app_usage:
            usage.add_metric([self.node, name, "cpu", priority, qos], cpu)
            usage.add_metric([self.node, name, "memory", priority, qos], memory)
        yield usage
