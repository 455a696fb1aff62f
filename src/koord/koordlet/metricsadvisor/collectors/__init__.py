"""One module per collector; ``all_collectors`` lists them in start order."""

from __future__ import annotations

from ..framework import Collector, Env
from .be_resource import BEResourceCollector
from .host_application import HostApplicationCollector
from .node_info import NodeInfoCollector
from .node_resource import NodeResourceCollector
from .pod_resource import PodResourceCollector
from .pod_throttled import PodThrottledCollector
from .psi import PSICollector
from .resctrl import ResctrlCollector
from .system_resource import SystemResourceCollector

COLLECTORS: tuple[type[Collector], ...] = (
    NodeInfoCollector, NodeResourceCollector, PodResourceCollector, HostApplicationCollector,
    SystemResourceCollector, BEResourceCollector, PodThrottledCollector, PSICollector,
    ResctrlCollector)


def all_collectors(env: Env) -> list[Collector]:
    return [cls(env) for cls in COLLECTORS]


__all__ = ["BEResourceCollector", "COLLECTORS", "HostApplicationCollector", "NodeInfoCollector",
           "NodeResourceCollector", "PSICollector", "PodResourceCollector", "PodThrottledCollector",
           "ResctrlCollector",
           "SystemResourceCollector", "all_collectors"]
