"""What koordlet knows about one pod and its containers, and where their cgroups are.

Every module reads pods through these two dataclasses, whatever the source (CRI or
kubelet's ``/pods``), so collectors, the reporter and the QoS manager never look at CRI
or API objects themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..resources import KoordQoS, KubeQoS

CGROUPFS, SYSTEMD = "cgroupfs", "systemd"
DEFAULT_KUBE_DIR = "kubepods/"


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
    koord_qos: str
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


def koord_qos_of(labels: Mapping[str, str]) -> str:
    """The pod's Koordinator QoS class from its label, "" when absent or unknown."""
    return KoordQoS.of(labels).value


def kube_qos_of_cgroup_parent(cgroup_parent: str) -> str:
    return KubeQoS.of_cgroup_parent(cgroup_parent).value


def driver_of_cgroup_parent(cgroup_parent: str) -> str:
    """kubelet's systemd driver names the pod's parent ``*.slice``; cgroupfs uses a path."""
    return SYSTEMD if cgroup_parent.rstrip("/").endswith(".slice") else CGROUPFS


def pod_cgroup_dir(kube_dir: str, kube_qos: str, uid: str, driver: str) -> str:
    """kubelet's pod cgroup dir under ``kube_dir``, as upstream's cgroup path formatter.

    cgroupfs: ``<kube_dir>/besteffort/pod<uid>`` (guaranteed pods sit in ``<kube_dir>``);
    systemd: ``<kube_dir>/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice``
    where ``kube_dir`` is ``kubepods.slice`` for kubelet's own tree.
    """
    qos = KubeQoS(kube_qos)
    if "/" in uid or not uid or uid in (".", ".."):
        raise ValueError(f"pod uid {uid!r} cannot name a cgroup dir")
    base = kube_dir.strip("/")
    if driver == SYSTEMD:
        if base == DEFAULT_KUBE_DIR.strip("/"):
            base = "kubepods.slice"
        escaped = uid.replace("-", "_")
        if qos is KubeQoS.GUARANTEED:
            return f"{base}/kubepods-pod{escaped}.slice"
        return f"{base}/kubepods-{qos.value}.slice/kubepods-{qos.value}-pod{escaped}.slice"
    if driver != CGROUPFS:
        raise ValueError(f"cgroup driver {driver!r}: want {CGROUPFS} or {SYSTEMD}")
    if qos is KubeQoS.GUARANTEED:
        return f"{base}/pod{uid}"
    return f"{base}/{qos.value}/pod{uid}"


def container_cgroup_dir(pod_dir: str, container_id: str, driver: str) -> str:
    """containerd's container cgroup under its pod dir (runc's naming per driver)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise ValueError(f"container id {container_id!r} cannot name a cgroup dir")
    if driver == SYSTEMD:
        return f"{pod_dir}/cri-containerd-{container_id}.scope"
    return f"{pod_dir}/{container_id}"


def milli_cpu_of_shares(shares: int | None) -> int:
    """kubelet sets shares = milli * 1024 / 1000 (at least 2); the inverse, 2 -> 0."""
    if not shares or shares <= 2:
        return 0
    return round(shares * 1000 / 1024)


def milli_cpu_of_quota(quota: int | None, period: int | None) -> int | None:
    if not quota or quota <= 0 or not period or period <= 0:
        return None
    return round(quota * 1000 / period)
