"""What koordlet knows about one pod and its containers, and where their cgroups are.

Every module reads pods through these two dataclasses, whatever the source (CRI or
kubelet's ``/pods``), so collectors, the reporter and the QoS manager never look at CRI
or API objects themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from ..resources import KoordQoS, KubeQoS

CGROUPFS, SYSTEMD = "cgroupfs", "systemd"
DEFAULT_KUBE_DIR = "kubepods/"


@dataclass
class ContainerMeta:
    """One container; ``requests``/``limits``: milli-cores for cpu, bytes for memory."""

    name: str
    id: str
    cgroup_dir: str
    running: bool
    requests: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)


@dataclass
class PodMeta:
    """One pod; ``cgroup_dir`` is relative to a cgroup subsystem root (v1) or the v2 root."""

    namespace: str
    name: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    kube_qos: str
    koord_qos: str
    priority: int | None
    cgroup_dir: str
    sandbox_id: str
    running: bool
    containers: list[ContainerMeta] = field(default_factory=list)
    created: float | None = None
    """Unix seconds the pod was created (its sandbox, or the API object); None when unknown."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def copy(self) -> PodMeta:
        """A copy the caller may change: every field is a str, int, bool, a dict of strings or
        ints, or a list of containers of those, so copying each level is a deep copy (and a
        tenth of ``copy.deepcopy``'s cost, which readers pay on every tick)."""
        return _copied(self, labels=dict(self.labels), annotations=dict(self.annotations),
                       containers=[_copied(c, requests=dict(c.requests), limits=dict(c.limits))
                                   for c in self.containers])


_M = TypeVar("_M", PodMeta, ContainerMeta)


def _copied(meta: _M, **changes: object) -> _M:
    """``dataclasses.replace`` without its per-call field introspection and ``__init__``
    (a third of its cost): these are plain dataclasses, their state is their ``__dict__``."""
    new = object.__new__(type(meta))
    new.__dict__.update(meta.__dict__, **changes)
    return new


def koord_qos_of(labels: dict[str, str]) -> str:
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
