"""koordlet's States Informer: this node's Node, NodeSLO, NodeMetric and pods.

``informer`` is the facade other modules use (it also hands out the API client when the
objects come from the API server); ``objects`` and ``pods`` are its sources (files or the
API server; CRI), ``meta`` the pod/container model (their cgroup dirs named by
``koordlet.cgrouplayout``), ``specs`` upstream's defaults for NodeSLO and NodeMetric specs,
``topology`` and ``nrt`` the NodeResourceTopology koordlet computes and reports.
"""

from .informer import CALLBACK_KINDS, NODE_TOPOLOGY, PODS, StatesInformer
from .meta import ContainerMeta, PodMeta
from .objects import NODE, NODE_METRIC, NODE_SLO, FileObjectsSource, KubeObjectsSource, in_cluster
from .pods import CriPodsSource, PodsUnavailable

__all__ = [
    "CALLBACK_KINDS", "NODE", "NODE_METRIC", "NODE_SLO", "NODE_TOPOLOGY", "PODS",
    "ContainerMeta", "CriPodsSource", "FileObjectsSource", "KubeObjectsSource", "PodMeta",
    "PodsUnavailable", "StatesInformer", "in_cluster",
]
