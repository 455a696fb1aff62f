"""What koordlet knows about one pod and its containers.

Every module reads pods through these two dataclasses, whatever the source (CRI or
kubelet's ``/pods``), so collectors, the reporter and the QoS manager never look at CRI
or API objects themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..resources import KoordQoS, KubeQoS


def _frozen(obj: object, *names: str) -> None:
    """Makes the named mapping fields of a just-built frozen dataclass read-only views of their
    own copies, so neither a reader nor whoever built the object can change it afterwards."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, MappingProxyType):
            object.__setattr__(obj, name, MappingProxyType(dict(value)))


@dataclass(frozen=True)
class ContainerMeta:
    """One container; ``requests``/``limits``: milli-cores for cpu, bytes for memory.

    Immutable (so is PodMeta): the states informer hands the same objects to every reader."""

    name: str
    id: str
    cgroup_dir: str
    running: bool
    requests: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _frozen(self, "requests", "limits")


@dataclass(frozen=True)
class PodMeta:
    """One pod; ``cgroup_dir`` is relative to a cgroup subsystem root (v1) or the v2 root."""

    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    kube_qos: str
    koord_qos: KoordQoS
    """Parsed from the label once, where the pod is built (``KoordQoS.of``)."""
    priority: int | None
    cgroup_dir: str
    sandbox_id: str
    running: bool
    containers: tuple[ContainerMeta, ...] = ()
    created: float | None = None
    """Unix seconds the pod was created (its sandbox, or the API object); None when unknown."""

    def __post_init__(self) -> None:
        _frozen(self, "labels", "annotations")
        if not isinstance(self.containers, tuple):  # a builder's list must not stay changeable
            object.__setattr__(self, "containers", tuple(self.containers))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def kube_qos_of_cgroup_parent(cgroup_parent: str) -> str:
    return KubeQoS.of_cgroup_parent(cgroup_parent).value


def milli_cpu_of_shares(shares: int | None) -> int:
    """kubelet sets shares = milli * 1024 / 1000 (at least 2); the inverse, 2 -> 0."""
    if not shares or shares <= 2:
        return 0
    return round(shares * 1000 / 1024)


def milli_cpu_of_quota(quota: int | None, period: int | None) -> int | None:
    if not quota or quota <= 0 or not period or period <= 0:
        return None
    return round(quota * 1000 / period)
