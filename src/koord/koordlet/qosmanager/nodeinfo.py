"""What the strategies read from the Node object, pod annotations and the CPU topology.

Each reader validates what it takes from outside (annotations, quantities, the metric
cache's ``node_cpu_info``) and raises NodeInfoError naming the field, so a strategy can
skip its tick with one clear log line instead of computing from garbage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from koord.apis.extension import (
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
    AnnotationError,
    NodeReservation,
    kubelet_cpu_manager_policy,
    node_reservation,
    resource_status,
    system_qos_resource,
)
from koord.hookapi import MAX_CPU_ID, parse_cpuset, parse_quantity

from ..resources import KoordQoS
from ..statesinformer import PodMeta

MAX_CPUS = MAX_CPU_ID + 1
"""No node has more; a larger id in an annotation or topology is an error, not an allocation."""


class NodeInfoError(ValueError):
    """A Node field, annotation or topology entry is unusable; the message names it."""


@dataclass(frozen=True)
class Processor:
    cpu: int
    core: int
    socket: int
    node: int


def _annotations(obj: dict | None) -> dict[str, str]:
    meta = (obj or {}).get("metadata") or {}
    ann = meta.get("annotations") if isinstance(meta, dict) else None
    return ann if isinstance(ann, dict) else {}


def node_quantity(node: dict, section: str, name: str) -> Fraction | None:
    status = node.get("status") if isinstance(node, dict) else None
    values = status.get(section) if isinstance(status, dict) else None
    if not isinstance(values, dict) or values.get(name) is None:
        return None
    try:
        q = parse_quantity(values[name])
    except ValueError as exc:
        raise NodeInfoError(f"Node status.{section}.{name}: {exc}") from None
    if q < 0 or q > 2**62:
        raise NodeInfoError(f"Node status.{section}.{name}={values[name]!r}: out of range")
    return q


def capacity_milli_cpu(node: dict) -> int:
    q = node_quantity(node, "capacity", "cpu")
    if q is None or q <= 0:
        raise NodeInfoError("Node status.capacity.cpu: missing or zero")
    return math.ceil(q * 1000)


def capacity_memory(node: dict) -> int:
    q = node_quantity(node, "capacity", "memory")
    if q is None or q <= 0:
        raise NodeInfoError("Node status.capacity.memory: missing or zero")
    return math.ceil(q)


def cpuset_of(text: Any, where: str) -> set[int]:
    if not isinstance(text, str):
        raise NodeInfoError(f"{where}={text!r:.40}: want a cpu list string")
    try:
        return set(parse_cpuset(text))
    except ValueError as exc:
        raise NodeInfoError(f"{where}: {exc}") from None


def reserved_milli_cpu(node: dict) -> int:
    """max(kubelet's reservation = capacity - allocatable, the reservation annotation)."""
    cap = node_quantity(node, "capacity", "cpu") or Fraction(0)
    alloc = node_quantity(node, "allocatable", "cpu")
    kubelet = max(cap - alloc, Fraction(0)) if alloc is not None else Fraction(0)
    reservation = _reservation(node)
    by_anno = Fraction(0)
    if reservation.cpu is not None:
        by_anno = reservation.cpu
    elif reservation.reserved_cpus:
        by_anno = Fraction(len(reserved_cpus(node)))
    return math.ceil(max(kubelet, by_anno) * 1000)


def _reservation(node: dict) -> NodeReservation:
    try:
        return node_reservation(_annotations(node))
    except AnnotationError as exc:
        raise NodeInfoError(str(exc)) from None


def reserved_cpus(node: dict) -> set[int]:
    text = _reservation(node).reserved_cpus
    if not text:
        return set()
    return cpuset_of(text, f"node annotation {ANNOTATION_NODE_RESERVATION}: reservedCPUs")


def system_qos_exclusive_cpus(node: dict) -> set[int]:
    try:
        system_qos = system_qos_resource(_annotations(node))
    except AnnotationError as exc:
        raise NodeInfoError(str(exc)) from None
    if system_qos is None or not system_qos.cpuset or not system_qos.is_exclusive:
        return set()
    return cpuset_of(system_qos.cpuset, f"node annotation {ANNOTATION_SYSTEM_QOS_RESOURCE}: cpuset")


def kubelet_static_policy(node: dict) -> bool:
    try:
        return kubelet_cpu_manager_policy(_annotations(node)).policy == "static"
    except AnnotationError as exc:
        raise NodeInfoError(str(exc)) from None


def pod_allocated_cpus(pod: PodMeta) -> set[int]:
    """The cpuset in the pod's resource-status annotation (empty when none)."""
    try:
        cpuset = resource_status(pod.annotations, owner=f"pod {pod.key}").cpuset
    except AnnotationError as exc:
        raise NodeInfoError(str(exc)) from None
    return set(parse_cpuset(cpuset)) if cpuset else set()


def processors(cpu_info: Any) -> list[Processor]:
    """Online processors of the metric cache's ``node_cpu_info`` KV value."""
    if not isinstance(cpu_info, dict) or not isinstance(cpu_info.get("processors"), list):
        raise NodeInfoError("node_cpu_info: want an object with a processors list")
    raw = cpu_info["processors"]
    if len(raw) > MAX_CPUS:
        raise NodeInfoError(f"node_cpu_info: {len(raw)} processors, more than {MAX_CPUS}")
    out: list[Processor] = []
    seen: set[int] = set()
    for i, p in enumerate(raw):
        if not isinstance(p, dict):
            raise NodeInfoError(f"node_cpu_info.processors[{i}]: want an object")
        values = []
        for key in ("cpu", "core", "socket", "node"):
            v = p.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_CPUS:
                raise NodeInfoError(f"node_cpu_info.processors[{i}].{key}={v!r:.40}: "
                                    f"want an integer in [0, {MAX_CPUS})")
            values.append(v)
        if values[0] in seen:
            raise NodeInfoError(f"node_cpu_info.processors[{i}]: cpu {values[0]} listed twice")
        seen.add(values[0])
        if p.get("online", True) is False:
            continue
        out.append(Processor(*values))
    return out


def is_be(pod: PodMeta) -> bool:
    """Koordinator's BE: the QoS label, or kube BestEffort for a pod without one."""
    if pod.koord_qos:
        return pod.koord_qos is KoordQoS.BE
    return pod.kube_qos == "besteffort"

