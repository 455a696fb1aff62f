"""A fake states informer for unit tests and benchmarks of koordlet modules that read pods.

It has the states informer's query side (``get_all_pods``, ``get_node``, ``get_node_slo``,
``has_synced``, ``register_callback``) over lists the test sets directly; ``node_slo`` is
the NodeSLO object as received, parsed as the states informer parses a version it takes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from koord.koordlet.resources import KoordQoS
from koord.koordlet.slo import NodeSLO, parse_node_slo
from koord.koordlet.statesinformer.meta import ContainerMeta, PodMeta
from koord.koordlet.statesinformer.specs import merged_node_slo


def container_meta(name: str, id: str, cgroup_dir: str, *, running: bool = True,
                   requests: Mapping[str, int] | None = None, limits: Mapping[str, int] | None = None) -> ContainerMeta:
    return ContainerMeta(name=name, id=id, cgroup_dir=cgroup_dir, running=running,
                         requests=requests or {}, limits=limits or {})


def pod_meta(namespace: str, name: str, uid: str, cgroup_dir: str, *, kube_qos: str = "burstable",
             koord_qos: KoordQoS | str = "", running: bool = True, containers: Iterable[ContainerMeta] = (),
             labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
             priority: int | None = None) -> PodMeta:
    """A PodMeta with the fields tests rarely care about filled in."""
    return PodMeta(namespace=namespace, name=name, uid=uid, labels=labels or {}, annotations=annotations or {},
                   kube_qos=kube_qos, koord_qos=KoordQoS(koord_qos), priority=priority, cgroup_dir=cgroup_dir,
                   sandbox_id=f"sandbox-{uid}", running=running, containers=tuple(containers))


def with_resources(pod: PodMeta, container: int = 0, *, requests: Mapping[str, int] | None = None,
                   limits: Mapping[str, int] | None = None) -> PodMeta:
    """``pod`` with ``requests`` and ``limits`` added to those of its container ``container``:
    PodMeta is immutable, so a test builds the changed pod."""
    old = pod.containers[container]
    new = replace(old, requests={**old.requests, **(requests or {})}, limits={**old.limits, **(limits or {})})
    return replace(pod, containers=(*pod.containers[:container], new, *pod.containers[container + 1:]))


class FakeStatesInformer:
    def __init__(self, pods: list[Any] | None = None, node_slo: Any = None, node: dict | None = None,
                 synced: bool = True) -> None:
        self.pods = list(pods or [])
        self.node_slo = node_slo
        self.node = node
        self.synced = synced
        self.node_topo: dict | None = None
        self.callbacks: dict[str, list[Callable[[], None]]] = {}

    def get_all_pods(self) -> list[Any]:
        """As the informer's: a new list of the same (immutable) pods."""
        return list(self.pods)

    def get_node_slo(self) -> NodeSLO | None:
        return None if self.node_slo is None else parse_node_slo(merged_node_slo(self.node_slo))

    def get_node(self) -> dict | None:
        return self.node

    def get_node_topo(self) -> dict | None:
        return copy.deepcopy(self.node_topo)

    def set_node_topo(self, obj: dict) -> None:
        self.node_topo = copy.deepcopy(obj)

    def has_synced(self) -> bool:
        return self.synced

    def register_callback(self, kind: str, fn: Callable[[], None]) -> None:
        self.callbacks.setdefault(kind, []).append(fn)
