"""Where kubelet's cgroups are: one object, made once from the flags and handed to every
module that turns a pod, a container or a kube QoS class into a cgroup dir.

The layout is the cgroup root (``--cgroup-root-dir``), kubelet's top dir of pods
(``--cgroup-kube-dir``), the driver (``--cgroup-driver``) and the hierarchy's version. With
the driver left to detection ("auto", kept as ``None``), each pod's cgroup parent tells
(systemd names it ``*.slice``), and without one the tree kubelet made does. kubelet and
runc name the dirs, relative to a v1 subsystem or the v2 root:

==========  ==============================  ==========================================================
            cgroupfs                        systemd
==========  ==============================  ==========================================================
kube dir    ``kubepods``                    ``kubepods.slice``
burstable   ``kubepods/burstable``          ``kubepods.slice/kubepods-burstable.slice``
pod         ``kubepods/burstable/pod<uid>`` ``…/kubepods-burstable.slice/kubepods-burstable-pod<u_i_d>.slice``
guaranteed  ``kubepods/pod<uid>``           ``kubepods.slice/kubepods-pod<u_i_d>.slice``
container   ``<pod>/<id>``                  ``<pod>/cri-containerd-<id>.scope``
==========  ==============================  ==========================================================

A ``--cgroup-kube-dir`` other than ``kubepods`` is used as given by both drivers.
"""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath

from .resources import KubeQoS

CGROUPFS, SYSTEMD, AUTO = "cgroupfs", "systemd", "auto"
DRIVERS = (CGROUPFS, SYSTEMD)
KUBE_DIR = "kubepods"
"""kubelet's top cgroup of pods; ``kubepods.slice`` under systemd."""
DEFAULT_ROOT = Path("/sys/fs/cgroup")


def checked_dir(cgroup_dir: str) -> str:
    """``cgroup_dir`` relative and normalised; ValueError when it names ``..``, so a pod's
    parent cannot lead a write outside the hierarchy."""
    rel = PurePosixPath(cgroup_dir.strip("/"))
    if ".." in rel.parts:
        raise ValueError(f"cgroup dir {cgroup_dir!r} leaves the cgroup root")
    return str(rel)


def driver_of_cgroup_parent(cgroup_parent: str) -> str:
    """kubelet's systemd driver names the pod's parent ``*.slice``; cgroupfs uses a path."""
    return SYSTEMD if cgroup_parent.rstrip("/").endswith(".slice") else CGROUPFS


def container_cgroup_dir(pod_dir: str, container_id: str, driver: str) -> str:
    """containerd's container cgroup under its pod dir (runc's naming per driver)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise ValueError(f"container id {container_id!r} cannot name a cgroup dir")
    if driver == SYSTEMD:
        return f"{pod_dir}/cri-containerd-{container_id}.scope"
    return f"{pod_dir}/{container_id}"


def _systemd_slice_dir(slice_name: str) -> str:
    """Expands a systemd slice name into its nesting: "a-b-c.slice" -> "a.slice/a-b.slice/a-b-c.slice"."""
    stem = slice_name.removesuffix(".slice")
    parts = stem.split("-")
    return "/".join("-".join(parts[:i]) + ".slice" for i in range(1, len(parts) + 1))


class CgroupLayout:
    """The node's cgroup tree as kubelet laid it out; see the module's table."""

    __slots__ = ("root", "kube_dir", "driver", "version")

    def __init__(self, root: Path | str = DEFAULT_ROOT, kube_dir: str = KUBE_DIR,
                 driver: str | None = None, version: int | None = None) -> None:
        if driver == AUTO:
            driver = None
        if driver not in (None, *DRIVERS):
            raise ValueError(f"cgroup driver {driver!r}: want {CGROUPFS!r} or {SYSTEMD!r}")
        if version not in (None, 1, 2):
            raise ValueError(f"cgroup version {version!r}: want 1 or 2")
        self.root = Path(root)
        self.kube_dir = checked_dir(kube_dir or KUBE_DIR)
        self.driver: str | None = driver
        """None: detected, per pod from its cgroup parent, else from the tree (``driver_for``)."""
        self.version: int = version or (2 if (self.root / "cgroup.controllers").exists() else 1)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CgroupLayout:
        """The layout of ``--cgroup-root-dir``, ``--cgroup-kube-dir`` and ``--cgroup-driver``."""
        return cls(args.cgroup_root_dir, args.cgroup_kube_dir, args.cgroup_driver)

    def driver_for(self, cgroup_parent: str | None = None) -> str:
        """The driver that named a pod: the configured one, else its cgroup parent's form,
        else (no parent to look at) the tree kubelet made, looked at on every call since
        kubelet may make it after koordlet started.

        kubelet's own kube dir has a name per driver, so its ``kubepods.slice`` tells; a
        slice given as the kube dir is systemd's; any other kube dir is the same dir under
        both drivers, and only systemd's QoS slices in it tell."""
        if self.driver:
            return self.driver
        if cgroup_parent is not None:
            return driver_of_cgroup_parent(cgroup_parent)
        if self.kube_dir.endswith(".slice"):
            return SYSTEMD
        base = self.root / "cpu" if self.version == 1 else self.root
        if self.kube_dir == KUBE_DIR:
            return SYSTEMD if (base / "kubepods.slice").is_dir() else CGROUPFS
        slices = (self.kube_qos_dir(qos, SYSTEMD) for qos in (KubeQoS.BURSTABLE, KubeQoS.BESTEFFORT))
        return SYSTEMD if any((base / d).is_dir() for d in slices) else CGROUPFS

    def _systemd_kube_dir(self) -> str:
        return "kubepods.slice" if self.kube_dir == KUBE_DIR else self.kube_dir

    def kube_qos_dir(self, qos: KubeQoS | str, driver: str | None = None) -> str:
        """kubelet's dir of a kube QoS class (``driver_for`` unless ``driver`` is given);
        guaranteed pods sit in the kube dir itself."""
        qos = KubeQoS(qos)
        if (driver or self.driver_for()) == SYSTEMD:
            base = self._systemd_kube_dir()
            return base if qos is KubeQoS.GUARANTEED else f"{base}/kubepods-{qos.value}.slice"
        return self.kube_dir if qos is KubeQoS.GUARANTEED else f"{self.kube_dir}/{qos.value}"

    def pod_dir(self, kube_qos: KubeQoS | str, uid: str, driver: str | None = None) -> str:
        """kubelet's cgroup dir of the pod ``uid`` of a QoS class, as upstream's cgroup path
        formatter; ValueError for a uid that cannot name a dir or an unknown driver."""
        qos = KubeQoS(kube_qos)
        if "/" in uid or not uid or uid in (".", ".."):
            raise ValueError(f"pod uid {uid!r} cannot name a cgroup dir")
        driver = driver or self.driver_for()
        if driver not in DRIVERS:
            raise ValueError(f"cgroup driver {driver!r}: want {CGROUPFS} or {SYSTEMD}")
        if driver == SYSTEMD:
            prefix = "kubepods" if qos is KubeQoS.GUARANTEED else f"kubepods-{qos.value}"
            leaf = f"{prefix}-pod{uid.replace('-', '_')}.slice"
        else:
            leaf = f"pod{uid}"
        return f"{self.kube_qos_dir(qos, driver)}/{leaf}"

    @staticmethod
    def pod_dir_of_parent(cgroup_parent: str) -> str:
        """kubelet's cgroup parent of a pod (CRI's, in either driver's form) as a dir;
        ValueError when it is empty or leaves the hierarchy."""
        parent = cgroup_parent.strip().strip("/")
        if not parent:
            raise ValueError("empty pod cgroup parent")
        if "/" not in parent and parent.endswith(".slice"):
            parent = _systemd_slice_dir(parent)
        return checked_dir(parent)

    def container_dir_of_parent(self, pod_cgroup_parent: str, container_id: str) -> str:
        """The cgroup dir of a container of the pod with cgroup parent ``pod_cgroup_parent``."""
        if not container_id or "/" in container_id:
            raise ValueError(f"bad container id {container_id!r} under {pod_cgroup_parent!r}")
        return container_cgroup_dir(self.pod_dir_of_parent(pod_cgroup_parent), container_id,
                                    self.driver_for(pod_cgroup_parent))
