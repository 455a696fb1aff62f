"""The value types at the bottom of koordlet: QoS classes and cgroup resource values.

The resource executor writes ``Resources`` into the cgroups of a ``KubeQoS`` class; the
runtime hooks' contexts, the states informer's pods, the metrics advisor and the QoS manager
all speak these types. This module imports nothing of koordlet, so every module above it can
import it without an import circle.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TypeVar

from google.protobuf.message import Message

from koord import cgrouplimits
from koord.apis.extension import LABEL_POD_QOS
from koord.apis.runtime.v1alpha1 import api_pb2


class KoordQoS(enum.StrEnum):
    """Koordinator QoS class from the pod label ``koordinator.sh/qosClass``."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    NONE = ""

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> KoordQoS:
        try:
            return cls(labels.get(LABEL_POD_QOS, ""))
        except ValueError:
            return cls.NONE


class KubeQoS(enum.StrEnum):
    """Kubernetes QoS class, as kubelet encodes it in the pod's cgroup parent."""

    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"

    @classmethod
    def of_cgroup_parent(cls, cgroup_parent: str) -> KubeQoS:
        if "besteffort" in cgroup_parent:
            return cls.BESTEFFORT
        if "burstable" in cgroup_parent:
            return cls.BURSTABLE
        return cls.GUARANTEED


@dataclass(frozen=True)
class CgroupFile:
    """A koordlet-only cgroup file a plugin declares (``RuntimePlugin.cgroup_files``) and
    answers in ``Resources.files``: the executor writes it with the kernel's range checked,
    so a new plugin's file needs no change to the executor or to ``Resources``."""

    name: str
    """Its logical name, as in logs (``cpu_idle``)."""
    subsystem: str
    """The cgroup v1 hierarchy holding it."""
    v1: str
    v2: str
    lo: int
    hi: int
    """The integers the kernel accepts, both included."""

    def problem(self, value: int) -> str | None:
        """None when the kernel accepts ``value``; checked before an answer leaves a plugin
        and again before the executor writes."""
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        if not self.lo <= value <= self.hi:
            return f"{value} is out of range: the kernel accepts [{self.lo}, {self.hi}]"
        return None


@dataclass
class Resources:
    """Resource values, every field of the protocol's LinuxContainerResources; None means
    "not set by anyone" (the protocol's zero value).

    cpu_bvt_warp_ns (group identity) and ``files`` are koordlet-only: they are written to
    cgroup files and never travel on the wire.
    """

    cpu_period: int | None = None
    cpu_quota: int | None = None
    cpu_shares: int | None = None
    memory_limit: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    cpu_bvt_warp_ns: int | None = None
    unified: dict[str, str] = field(default_factory=dict)
    memory_swap_limit: int | None = None
    oom_score_adj: int | None = None
    hugepage_limits: dict[str, int] = field(default_factory=dict)
    """Page size (``2MB``, ``1GB``) -> limit in bytes."""
    files: dict[CgroupFile, int] = field(default_factory=dict)
    """Plugins' own cgroup files (``CgroupFile``) -> value."""

    def is_empty(self) -> bool:
        return all(getattr(self, name) in (None, {}) for name in _FIELD_NAMES)

    def copy(self) -> Resources:
        """An independent copy: the fields are ints, strings and dicts of them, so copying the
        dicts is a deep copy, at a fraction of ``copy.deepcopy``'s cost (hooks pay it per plugin
        call)."""
        new = copy.copy(self)
        new.unified = dict(self.unified)
        new.hugepage_limits = dict(self.hugepage_limits)
        new.files = dict(self.files)
        return new

    def problems(self, prefix: str) -> list[str]:
        """Values the kernel's cgroup files would refuse; checked before any answer or write."""
        found = []
        for name, kind in _KERNEL_LIMITS:
            value = getattr(self, name)
            why = cgrouplimits.problem(kind, value) if value is not None else None
            if why:
                found.append(f"{prefix}.{name}: {why}")
        for file, number in self.files.items():
            why = file.problem(number)
            if why:
                found.append(f"{prefix}.{file.name}: {why}")
        return found

    def update(self, other: Resources) -> None:
        """Takes every value ``other`` sets; used when a later plugin refines an earlier one."""
        for name in _FIELD_NAMES:
            value = getattr(other, name)
            if isinstance(value, dict):
                getattr(self, name).update(value)
            elif value is not None:
                setattr(self, name, value)

    @classmethod
    def from_proto(cls, msg: api_pb2.LinuxContainerResources) -> Resources:
        return cls(
            cpu_period=msg.cpu_period or None,
            cpu_quota=msg.cpu_quota or None,
            cpu_shares=msg.cpu_shares or None,
            memory_limit=msg.memory_limit_in_bytes or None,
            cpuset_cpus=msg.cpuset_cpus or None,
            cpuset_mems=msg.cpuset_mems or None,
            unified=dict(msg.unified),
            memory_swap_limit=msg.memory_swap_limit_in_bytes or None,
            oom_score_adj=msg.oom_score_adj or None,
            hugepage_limits={h.page_size: h.limit for h in msg.hugepage_limits},
        )

    def to_proto(self) -> api_pb2.LinuxContainerResources | None:
        """None when nothing travels on the wire (bvt is koordlet-only)."""
        return present(api_pb2.LinuxContainerResources(
            cpu_period=self.cpu_period or 0,
            cpu_quota=self.cpu_quota or 0,
            cpu_shares=self.cpu_shares or 0,
            memory_limit_in_bytes=self.memory_limit or 0,
            cpuset_cpus=self.cpuset_cpus or "",
            cpuset_mems=self.cpuset_mems or "",
            unified=self.unified,
            memory_swap_limit_in_bytes=self.memory_swap_limit or 0,
            oom_score_adj=self.oom_score_adj or 0,
            hugepage_limits=[api_pb2.HugepageLimit(page_size=size, limit=limit)
                             for size, limit in self.hugepage_limits.items()],
        ))


_FIELD_NAMES = tuple(f.name for f in fields(Resources))
"""Looked up once: ``dataclasses.fields`` costs more than the loops over it."""
_KERNEL_LIMITS = (
    ("cpu_period", cgrouplimits.Kind.PERIOD),
    ("cpu_quota", cgrouplimits.Kind.QUOTA),
    ("cpu_shares", cgrouplimits.Kind.SHARES),
    ("memory_limit", cgrouplimits.Kind.MEMORY),
    ("memory_swap_limit", cgrouplimits.Kind.MEMORY),
    ("cpu_bvt_warp_ns", cgrouplimits.Kind.BVT),
    ("oom_score_adj", cgrouplimits.Kind.OOM_SCORE_ADJ),
)


_M = TypeVar("_M", bound=Message)


def present(msg: _M) -> _M | None:
    """An all-zero sub-message as None, so it stays absent on the wire (zero = not specified)."""
    return msg if msg.ByteSize() else None
