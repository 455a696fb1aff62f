"""The inputs of the NodeResourceTopology, validated: the CPU topology and NUMA layout the
metrics advisor keeps in the metric cache, the kubelet's configuration (``/configz``) and
static CPU allocations (``cpu_manager_state``), and the cpusets pods are bound to. A bad
input raises TopologyError naming it; ``topology`` computes from what these return.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from koord.apis.extension import AnnotationError, resource_status
from koord.hookapi import MAX_CPU_ID, json_document, parse_cpuset, parse_quantity

from .meta import PodMeta

NONE_POLICY = "None"
MAX_STATE_BYTES = 4 * 1024 * 1024
MAX_ENTRIES = 10_000

_TOPOLOGY_POLICIES = {
    ("container", "single-numa-node"): "SingleNUMANodeContainerLevel",
    ("container", "restricted"): "RestrictedContainerLevel",
    ("container", "best-effort"): "BestEffortContainerLevel",
    ("pod", "single-numa-node"): "SingleNUMANodePodLevel",
    ("pod", "restricted"): "RestrictedPodLevel",
    ("pod", "best-effort"): "BestEffortPodLevel",
}


class TopologyError(ValueError):
    """An input of the topology (a file, the kubelet's answer, an annotation) is unusable; names it."""


@dataclass(frozen=True)
class CPU:
    id: int
    core: int
    socket: int
    node: int


# ---- inputs -----------------------------------------------------------------------------

def _int(value: Any, where: str, top: int = MAX_CPU_ID) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise TopologyError(f"{where}={value!r:.40}: want an integer in [0, {top}]")
    return value


def cpus_of(cpu_info: Any) -> list[CPU]:
    """The metric cache's ``node_cpu_info`` -> every processor, sorted by id."""
    procs = cpu_info.get("processors") if isinstance(cpu_info, dict) else None
    if not isinstance(procs, list) or not procs or len(procs) > MAX_CPU_ID + 1:
        raise TopologyError("node_cpu_info: want a processors list of 1..4096 entries")
    out: dict[int, CPU] = {}
    for i, p in enumerate(procs):
        if not isinstance(p, dict):
            raise TopologyError(f"node_cpu_info.processors[{i}]: want an object")
        where = f"node_cpu_info.processors[{i}]"
        cpu = CPU(_int(p.get("cpu"), f"{where}.cpu"), _int(p.get("core"), f"{where}.core"),
                  _int(p.get("socket"), f"{where}.socket"), _int(p.get("node"), f"{where}.node"))
        if cpu.id in out:
            raise TopologyError(f"{where}: cpu {cpu.id} listed twice")
        out[cpu.id] = cpu
    return [out[k] for k in sorted(out)]


def numa_memory_of(numa_info: Any) -> dict[int, int]:
    """The metric cache's ``node_numa_info`` -> NUMA node id -> its memory in bytes."""
    nodes = numa_info.get("nodes") if isinstance(numa_info, dict) else None
    if not isinstance(nodes, list) or len(nodes) > 1024:
        raise TopologyError("node_numa_info: want a nodes list")
    out = {}
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise TopologyError(f"node_numa_info.nodes[{i}]: want an object")
        out[_int(n.get("id"), f"node_numa_info.nodes[{i}].id", 1023)] = _int(
            n.get("memory_total_bytes"), f"node_numa_info.nodes[{i}].memory_total_bytes", 2**62)
    return out


@dataclass(frozen=True)
class KubeletConfig:
    """What the topology needs of the kubelet's configuration (its ``/configz``)."""

    cpu_manager_policy: str = ""
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    topology_manager_policy: str = ""
    topology_manager_scope: str = ""
    reserved_system_cpus: str = ""
    reserved_cpu: Fraction = Fraction(0)
    """kubeReserved + systemReserved cpu: how many cpus the static policy keeps for the system."""


def mapping_of(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: want an object")
    return value


def _strings(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TopologyError(f"{where}: want an object of strings")
    return dict(value)


def kubelet_config_of(data: bytes) -> KubeletConfig:
    """The kubelet's ``/configz`` answer (``{"kubeletconfig": {...}}``)."""
    doc = json_document(data, "kubelet /configz", TopologyError)
    conf = doc.get("kubeletconfig")
    if not isinstance(conf, dict):
        raise TopologyError("kubelet /configz: no kubeletconfig object")
    texts = {}
    for key in ("cpuManagerPolicy", "topologyManagerPolicy", "topologyManagerScope", "reservedSystemCPUs"):
        value = conf.get(key) or ""
        if not isinstance(value, str) or len(value) > 1024:
            raise TopologyError(f"kubelet /configz: kubeletconfig.{key}={value!r:.40}: want a string")
        texts[key] = value
    reserved = Fraction(0)
    for key in ("kubeReserved", "systemReserved"):
        cpu = _strings(conf.get(key), f"kubelet /configz: kubeletconfig.{key}").get("cpu")
        if cpu:
            try:
                reserved += max(parse_quantity(cpu), Fraction(0))
            except ValueError as exc:
                raise TopologyError(f"kubelet /configz: kubeletconfig.{key}.cpu: {exc}") from None
    return KubeletConfig(
        cpu_manager_policy=texts["cpuManagerPolicy"],
        cpu_manager_policy_options=_strings(conf.get("cpuManagerPolicyOptions"),
                                            "kubelet /configz: kubeletconfig.cpuManagerPolicyOptions"),
        topology_manager_policy=texts["topologyManagerPolicy"],
        topology_manager_scope=texts["topologyManagerScope"],
        reserved_system_cpus=texts["reservedSystemCPUs"], reserved_cpu=reserved)


def cpu_manager_entries(data: bytes) -> dict[str, dict[str, str]]:
    """The kubelet's ``cpu_manager_state`` checkpoint -> pod uid -> container -> cpu list."""
    if not data:
        raise TopologyError("cpu_manager_state: empty state file")
    doc = json_document(data, "cpu_manager_state", TopologyError)
    entries = doc.get("entries") or {}
    if not isinstance(entries, dict) or len(entries) > MAX_ENTRIES:
        raise TopologyError("cpu_manager_state: entries is not an object of pods")
    return {str(uid): _strings(containers, f"cpu_manager_state: entries[{uid!r:.40}]")
            for uid, containers in entries.items()}


def topology_policy(policy: str, scope: str) -> str:
    """The kubelet's topology manager policy and scope as a NodeResourceTopology policy."""
    return _TOPOLOGY_POLICIES.get((scope, policy), NONE_POLICY)


def cpus_or_none(text: Any) -> list[int] | None:
    """A cpu list, or None when it does not parse (upstream skips such values)."""
    if not isinstance(text, str):
        return None
    try:
        return parse_cpuset(text)
    except ValueError:
        return None


def resource_status_cpus(pod: PodMeta) -> list[int]:
    """The cpuset the scheduler bound the pod to (empty when none or unparsable)."""
    try:
        cpuset = resource_status(pod.annotations, owner=f"pod {pod.key}").cpuset
    except AnnotationError:
        return []
    return cpus_or_none(cpuset) or []
