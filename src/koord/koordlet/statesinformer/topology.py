"""The NodeResourceTopology koordlet reports: what it holds, computed from this node.

Pure functions, no I/O: the CPU topology and NUMA layout come from the metric cache's
``node_cpu_info`` / ``node_numa_info`` (written by the metrics advisor from /sys and
/proc), the kubelet's configuration from its ``/configz``, its static CPU allocations from
``cpu_manager_state``, reservations from the Node's annotations, and the LSE/LSR cpusets
from the pods' ``scheduling.koordinator.sh/resource-status``. The annotations are written
with upstream's JSON shapes (Go's ``encoding/json`` of the ``apis/extension`` types: field
order, ``omitempty``, ``null`` for an empty list), because koord-scheduler and
koord-manager decode them.

Every input from outside is validated here and a bad one raises TopologyError naming it.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from koord.apis.extension import (
    ANNOTATION_BE_CPU_SHARED_POOLS,
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_CPU_TOPOLOGY,
    ANNOTATION_ENABLE_NUMA_RESERVATION,
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_POD_CPU_ALLOCS,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
    AnnotationError,
    resource_status,
)
from koord.hookapi import MAX_CPU_ID, format_cpuset, json_document, parse_cpuset, parse_quantity

from .meta import PodMeta

MANAGED_BY = "app.kubernetes.io/managed-by"

MANAGED_ANNOTATIONS = (ANNOTATION_CPU_BASIC_INFO, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, ANNOTATION_CPU_SHARED_POOLS,
                       ANNOTATION_BE_CPU_SHARED_POOLS, ANNOTATION_CPU_TOPOLOGY, ANNOTATION_POD_CPU_ALLOCS,
                       ANNOTATION_NODE_RESERVATION, ANNOTATION_SYSTEM_QOS_RESOURCE)
MANAGED_LABELS = (ANNOTATION_ENABLE_NUMA_RESERVATION,)
MANAGED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "hugepages-2Mi", "hugepages-1Gi")
ZONE_TYPE = "Node"
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


def go_json(value: Any) -> str:
    """Go's ``json.Marshal`` bytes for plain values: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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


def _mapping(value: Any, where: str) -> dict:
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


def _cpuset(text: Any) -> list[int] | None:
    """A cpu list, or None when it does not parse (upstream skips such values)."""
    if not isinstance(text, str):
        return None
    try:
        return parse_cpuset(text)
    except ValueError:
        return None


def _annotation_object(annotations: Mapping[str, str], key: str, where: str) -> dict | None:
    text = annotations.get(key)
    if not text:
        return None
    if not isinstance(text, str) or len(text) > 256 * 1024:
        raise TopologyError(f"{where} annotation {key}: want a JSON string of at most 256 KiB")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise TopologyError(f"{where} annotation {key}: not JSON") from None
    if value is not None and not isinstance(value, dict):
        raise TopologyError(f"{where} annotation {key}: want an object")
    return value


def resource_status_cpus(pod: PodMeta) -> list[int]:
    """The cpuset the scheduler bound the pod to (empty when none or unparsable)."""
    try:
        cpuset = resource_status(pod.annotations, owner=f"pod {pod.key}").cpuset
    except AnnotationError:
        return []
    return _cpuset(cpuset) or []


# ---- the computations (upstream's, with its test tables) -----------------------------------

def take_by_topology(cpus: list[CPU], count: int) -> list[int]:
    """``count`` cpus the way the kubelet's static policy reserves them: whole sockets, then
    whole cores (lowest socket and core first), then single threads of the socket already
    used."""
    if count <= 0:
        return []
    taken: list[int] = []
    by_socket: dict[int, list[CPU]] = {}
    for c in cpus:
        by_socket.setdefault(c.socket, []).append(c)
    for socket in sorted(by_socket):
        if count - len(taken) >= len(by_socket[socket]):
            taken += [c.id for c in by_socket[socket]]
    cores: dict[tuple[int, int], list[int]] = {}
    for c in cpus:
        if c.id not in taken:
            cores.setdefault((c.socket, c.core), []).append(c.id)
    for key in sorted(cores):
        if count - len(taken) >= len(cores[key]):
            taken += cores.pop(key)
    sockets_used = {c.socket for c in cpus if c.id in taken}
    rest = sorted((c for c in cpus if c.id not in taken),
                  key=lambda c: (c.socket not in sockets_used, c.socket, c.id))
    taken += [c.id for c in rest[:count - len(taken)]]
    return sorted(taken)


def node_reservation(annotations: Mapping[str, str], cpus: list[CPU]) -> dict:
    """``node.koordinator.sh/reservation`` as upstream re-writes it: the Node's value with
    ``reservedCPUs`` resolved (a cpu quantity becomes that many cpus taken by topology;
    an unparsable list becomes none)."""
    try:
        anno = _annotation_object(annotations, ANNOTATION_NODE_RESERVATION, "node") or {}
    except TopologyError:
        anno = {}
    out: dict[str, Any] = {}
    resources = anno.get("resources")
    if isinstance(resources, dict) and resources:
        out["resources"] = resources
    reserved_text = anno.get("reservedCPUs") if isinstance(anno.get("reservedCPUs"), str) else ""
    if reserved_text:
        reserved = _cpuset(reserved_text) or []
    else:
        count = 0
        if isinstance(resources, dict) and resources.get("cpu") is not None:
            try:
                count = math.ceil(parse_quantity(resources["cpu"]))
            except ValueError:
                count = 0
        reserved = take_by_topology(cpus, min(count, len(cpus)))
    if reserved:
        out["reservedCPUs"] = format_cpuset(reserved)
    if isinstance(anno.get("applyPolicy"), str) and anno["applyPolicy"]:
        out["applyPolicy"] = anno["applyPolicy"]
    return out


def system_qos_resource(annotations: Mapping[str, str]) -> dict | None:
    """``node.koordinator.sh/system-qos-resource`` of the Node (None when absent)."""
    anno = _annotation_object(annotations, ANNOTATION_SYSTEM_QOS_RESOURCE, "node")
    if anno is None:
        return None
    out: dict[str, Any] = {}
    if isinstance(anno.get("cpuset"), str) and anno["cpuset"]:
        out["cpuset"] = anno["cpuset"]
    exclusive = anno.get("cpusetExclusive")
    if exclusive is not None:
        if not isinstance(exclusive, bool):
            raise TopologyError(f"node annotation {ANNOTATION_SYSTEM_QOS_RESOURCE}: cpusetExclusive is not a boolean")
        out["cpusetExclusive"] = exclusive
    return out


def pod_cpu_allocs(entries: Mapping[str, Mapping[str, str]], pods: Iterable[PodMeta],
                   shared: dict[int, CPU]) -> list[dict]:
    """The kubelet's static allocations of pods Koordinator does not manage (LS/BE pods and
    pods with a resource-status cpuset are its own); their cpus leave ``shared``."""
    by_uid = {p.uid: p for p in pods}
    managed = {p.uid for p in by_uid.values() if p.koord_qos in ("LS", "BE") or resource_status_cpus(p)}
    allocs = []
    for uid in entries:
        if uid in managed:
            continue
        cpus: set[int] = set()
        for text in entries[uid].values():
            cpus.update(_cpuset(text) or [])
        if not cpus:
            continue
        alloc: dict[str, Any] = {}
        pod = by_uid.get(uid)
        if pod is not None:
            alloc["namespace"], alloc["name"] = pod.namespace, pod.name
        alloc.update(uid=uid, cpuset=format_cpuset(cpus), managedByKubelet=True)
        allocs.append(alloc)
        for cpu in cpus:
            shared.pop(cpu, None)
    return sorted(allocs, key=lambda a: a["uid"])


def shared_pools_of(cpus: Mapping[int, CPU]) -> list[dict]:
    """One pool per NUMA node, ordered by (socket, node), as ``CPUSharedPool`` values."""
    by_node: dict[int, list[CPU]] = {}
    for c in cpus.values():
        by_node.setdefault(c.node, []).append(c)
    pools = [{"socket": min(group, key=lambda c: c.id).socket, "node": node,
              "cpuset": format_cpuset(c.id for c in group)} for node, group in by_node.items()]
    return sorted(pools, key=lambda p: (p["socket"], p["node"]))


def cpu_share_pools(shared: Mapping[int, CPU], pods: Iterable[PodMeta]) -> tuple[list[dict], list[dict]]:
    """LS pool: shared cpus minus every resource-status cpuset; BE pool: minus LSE's only."""
    ls, be = dict(shared), dict(shared)
    for pod in pods:
        bound = resource_status_cpus(pod)
        for cpu in bound:
            ls.pop(cpu, None)
            if pod.koord_qos == "LSE":
                be.pop(cpu, None)
    return shared_pools_of(ls), shared_pools_of(be)


def remove_cpus(pools: list[dict], cpus: Iterable[int]) -> list[dict]:
    gone = set(cpus)
    out = []
    for pool in pools:
        pool = dict(pool)
        pool["cpuset"] = format_cpuset(set(parse_cpuset(pool["cpuset"])) - gone)
        if not pool["cpuset"]:
            del pool["cpuset"]
        out.append(pool)
    return out


def format_binary_quantity(value: int) -> str:
    """A byte count as Kubernetes prints a BinarySI quantity (the largest exact suffix)."""
    if value == 0:
        return "0"
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value % (1 << power) == 0:
            return f"{value >> power}{suffix}"
    return str(value)


def zones_of(cpus: list[CPU], numa_memory: Mapping[int, int]) -> list[dict]:
    """One zone ``node-<id>`` per NUMA node with its cpus and memory (hugepages reported 0)."""
    cpu_count: dict[int, int] = {}
    for c in cpus:
        cpu_count[c.node] = cpu_count.get(c.node, 0) + 1
    if set(numa_memory) and set(cpu_count) != set(numa_memory):
        raise TopologyError(f"NUMA nodes of the cpus {sorted(cpu_count)} and of the memory "
                            f"{sorted(numa_memory)} do not match")
    zones = []
    for node in sorted(set(cpu_count) | set(numa_memory)):
        values = {"cpu": str(cpu_count.get(node, 0)), "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                  "memory": format_binary_quantity(numa_memory.get(node, 0))}
        zones.append({"name": f"node-{node}", "type": ZONE_TYPE, "resources": [
            {"name": name, "capacity": q, "allocatable": q, "available": q} for name, q in sorted(values.items())]})
    return sorted(zones, key=lambda z: z["name"])


@dataclass
class TopologyStatus:
    """What koordlet owns in the NodeResourceTopology."""

    annotations: dict[str, str]
    labels: dict[str, str]
    policy: str
    zones: list[dict]


def compute(*, node: dict, pods: list[PodMeta], cpu_info: Any, numa_info: Any, basic_info: dict,
            kubelet: KubeletConfig | None, cpu_manager_state: bytes | None) -> TopologyStatus:
    """The whole status, as upstream's ``calcNodeTopo``. ``kubelet`` None: not queried
    (``--disable-query-kubelet-config``); ``cpu_manager_state`` None: no state file."""
    cpus = cpus_of(cpu_info)
    zones = zones_of(cpus, numa_memory_of(numa_info))
    shared = {c.id: c for c in cpus}
    policy: dict[str, Any] = {}
    allocs: list[dict] | None = None
    topo_policy = NONE_POLICY
    if kubelet is not None:
        if kubelet.cpu_manager_policy:
            policy["policy"] = kubelet.cpu_manager_policy
        if kubelet.cpu_manager_policy_options:
            policy["options"] = dict(sorted(kubelet.cpu_manager_policy_options.items()))
        if kubelet.cpu_manager_policy == "static":
            reserved = (_cpuset(kubelet.reserved_system_cpus) if kubelet.reserved_system_cpus
                        else take_by_topology(cpus, math.ceil(kubelet.reserved_cpu)))
            if reserved:
                policy["reservedCPUs"] = format_cpuset(reserved)
            if cpu_manager_state:
                allocs = pod_cpu_allocs(cpu_manager_entries(cpu_manager_state), pods, shared) or None
        topo_policy = topology_policy(kubelet.topology_manager_policy, kubelet.topology_manager_scope)
    node_meta = _mapping(node.get("metadata"), "Node metadata")
    node_annotations = _mapping(node_meta.get("annotations"), "Node metadata.annotations")
    reservation = node_reservation(node_annotations, cpus)
    system_qos = system_qos_resource(node_annotations)
    ls_pools, be_pools = cpu_share_pools(shared, pods)
    reserved_cpus = _cpuset(reservation.get("reservedCPUs", "")) or []
    ls_pools, be_pools = remove_cpus(ls_pools, reserved_cpus), remove_cpus(be_pools, reserved_cpus)
    if system_qos and system_qos.get("cpuset") and system_qos.get("cpusetExclusive", True):
        sys_cpus = _cpuset(system_qos["cpuset"]) or []
        ls_pools, be_pools = remove_cpus(ls_pools, sys_cpus), remove_cpus(be_pools, sys_cpus)
    annotations = {
        ANNOTATION_CPU_BASIC_INFO: go_json(basic_info),
        ANNOTATION_CPU_TOPOLOGY: go_json({"detail": [{"id": c.id, "core": c.core, "socket": c.socket, "node": c.node}
                                          for c in cpus]}),
        ANNOTATION_CPU_SHARED_POOLS: go_json(ls_pools or None),
        ANNOTATION_KUBELET_CPU_MANAGER_POLICY: go_json(policy),
        ANNOTATION_BE_CPU_SHARED_POOLS: go_json(be_pools or None),
        ANNOTATION_POD_CPU_ALLOCS: go_json(allocs),
        ANNOTATION_NODE_RESERVATION: go_json(reservation),
        ANNOTATION_SYSTEM_QOS_RESOURCE: go_json(system_qos),
    }
    labels = {}
    node_labels = _mapping(node_meta.get("labels"), "Node metadata.labels")
    if node_labels.get(ANNOTATION_ENABLE_NUMA_RESERVATION):
        labels[ANNOTATION_ENABLE_NUMA_RESERVATION] = node_labels[ANNOTATION_ENABLE_NUMA_RESERVATION]
    return TopologyStatus(annotations=annotations, labels=labels, policy=topo_policy, zones=zones)


# ---- the object ---------------------------------------------------------------------------

def new_nrt(node: dict) -> dict:
    """The object koordlet creates when its node has none, owned by the Node."""
    meta = node.get("metadata") or {}
    return {"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
            "metadata": {"name": meta.get("name"), "labels": {MANAGED_BY: "Koordinator"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": meta.get("name"),
                                              "uid": meta.get("uid") or "", "controller": True,
                                              "blockOwnerDeletion": True}]},
            "topologyPolicies": [NONE_POLICY], "zones": []}


def _decoded(text: str | None) -> Any:
    try:
        return json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return text


def _managed_quantities(zones: list[dict]) -> list[tuple[Any, Any, dict]]:
    out = []
    for z in zones:
        values = {r.get("name"): (str(r.get("capacity")), str(r.get("allocatable")))
                  for r in z.get("resources") or [] if r.get("name") in MANAGED_RESOURCES}
        out.append((z.get("name"), z.get("type"), values))
    return out


def changed(status: TopologyStatus, nrt: dict | None) -> str | None:
    """Why ``nrt`` must be rewritten to hold ``status``; None when it already does."""
    if nrt is None or not (nrt.get("metadata") or {}).get("annotations"):
        return "metadata changed"
    if nrt.get("topologyPolicies") != [status.policy]:
        return "TopologyPolicies changed"
    old = nrt["metadata"]["annotations"]
    for key in MANAGED_ANNOTATIONS:
        if (key in old) != (key in status.annotations) or _decoded(old.get(key)) != _decoded(
                status.annotations.get(key)):
            return f"annotations changed, key {key}"
    old_labels = nrt["metadata"].get("labels") or {}
    for key in MANAGED_LABELS:
        if old_labels.get(key) != status.labels.get(key):
            return f"labels changed, key {key}"
    if _managed_quantities(nrt.get("zones") or []) != _managed_quantities(status.zones):
        return "Zones changed"
    return None


def updated(status: TopologyStatus, nrt: dict) -> dict:
    """``nrt`` holding ``status``: annotations and labels merged, zones replaced keeping the
    resources others report in the same zones."""
    new = copy.deepcopy(nrt)
    meta = new.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), **status.annotations}
    meta["labels"] = {**(meta.get("labels") or {}), **status.labels}
    new["topologyPolicies"] = [status.policy]
    old = {z.get("name"): z for z in nrt.get("zones") or []}
    zones = []
    for zone in status.zones:
        others = [r for r in (old.get(zone["name"]) or {}).get("resources") or []
                  if r.get("name") not in MANAGED_RESOURCES]
        zones.append(dict(zone, resources=sorted(copy.deepcopy(zone["resources"] + others),
                                                 key=lambda r: r["name"])))
    new["zones"] = zones
    return new
