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
from dataclasses import dataclass
from typing import Any

from koord.apis.extension import (
    ANNOTATION_BE_CPU_SHARED_POOLS,
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_CPU_TOPOLOGY,
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_NODE_RESERVATION,
    ANNOTATION_POD_CPU_ALLOCS,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
    LABEL_ENABLE_NUMA_RESERVATION,
    AnnotationError,
    NodeReservation,
)
from koord.apis.extension import node_reservation as parse_node_reservation
from koord.apis.extension import system_qos_resource as parse_system_qos_resource
from koord.hookapi import format_cpuset, parse_cpuset

from ..resources import KoordQoS
from .meta import PodMeta
from .topologyinputs import (
    CPU,
    NONE_POLICY,
    KubeletConfig,
    TopologyError,
    cpu_manager_entries,
    cpus_of,
    cpus_or_none,
    mapping_of,
    numa_memory_of,
    resource_status_cpus,
    topology_policy,
)

MANAGED_BY = "app.kubernetes.io/managed-by"
NO_RESERVATION = NodeReservation({}, None, "", "")

MANAGED_ANNOTATIONS = (ANNOTATION_CPU_BASIC_INFO, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, ANNOTATION_CPU_SHARED_POOLS,
                       ANNOTATION_BE_CPU_SHARED_POOLS, ANNOTATION_CPU_TOPOLOGY, ANNOTATION_POD_CPU_ALLOCS,
                       ANNOTATION_NODE_RESERVATION, ANNOTATION_SYSTEM_QOS_RESOURCE)
MANAGED_LABELS = (LABEL_ENABLE_NUMA_RESERVATION,)
MANAGED_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "hugepages-2Mi", "hugepages-1Gi")
ZONE_TYPE = "Node"
def go_json(value: Any) -> str:
    """Go's ``json.Marshal`` bytes for plain values: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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
    an unparsable list becomes none). A malformed annotation counts as none, as upstream's."""
    try:
        anno = parse_node_reservation(annotations)
    except AnnotationError:
        anno = NO_RESERVATION
    out: dict[str, Any] = {}
    if anno.resources:
        out["resources"] = dict(anno.resources)
    if anno.reserved_cpus:
        reserved = cpus_or_none(anno.reserved_cpus) or []
    else:
        count = math.ceil(anno.cpu) if anno.cpu is not None else 0
        reserved = take_by_topology(cpus, min(count, len(cpus)))
    if reserved:
        out["reservedCPUs"] = format_cpuset(reserved)
    if anno.apply_policy:
        out["applyPolicy"] = anno.apply_policy
    return out


def system_qos_resource(annotations: Mapping[str, str]) -> dict | None:
    """``node.koordinator.sh/system-qos-resource`` of the Node (None when absent) as Go's
    ``omitempty`` writes it back; TopologyError when malformed (upstream fails the report)."""
    try:
        anno = parse_system_qos_resource(annotations)
    except AnnotationError as exc:
        raise TopologyError(str(exc)) from None
    if anno is None:
        return None
    out: dict[str, Any] = {}
    if anno.cpuset:
        out["cpuset"] = anno.cpuset
    if anno.exclusive is not None:
        out["cpusetExclusive"] = anno.exclusive
    return out


def pod_cpu_allocs(entries: Mapping[str, Mapping[str, str]], pods: Iterable[PodMeta],
                   shared: dict[int, CPU]) -> list[dict]:
    """The kubelet's static allocations of pods Koordinator does not manage (LS/BE pods and
    pods with a resource-status cpuset are its own); their cpus leave ``shared``."""
    by_uid = {p.uid: p for p in pods}
    managed = {p.uid for p in by_uid.values() if p.koord_qos in (KoordQoS.LS, KoordQoS.BE) or resource_status_cpus(p)}
    allocs = []
    for uid in entries:
        if uid in managed:
            continue
        cpus: set[int] = set()
        for text in entries[uid].values():
            cpus.update(cpus_or_none(text) or [])
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
            if pod.koord_qos is KoordQoS.LSE:
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
            reserved = (cpus_or_none(kubelet.reserved_system_cpus) if kubelet.reserved_system_cpus
                        else take_by_topology(cpus, math.ceil(kubelet.reserved_cpu)))
            if reserved:
                policy["reservedCPUs"] = format_cpuset(reserved)
            if cpu_manager_state:
                allocs = pod_cpu_allocs(cpu_manager_entries(cpu_manager_state), pods, shared) or None
        topo_policy = topology_policy(kubelet.topology_manager_policy, kubelet.topology_manager_scope)
    node_meta = mapping_of(node.get("metadata"), "Node metadata")
    node_annotations = mapping_of(node_meta.get("annotations"), "Node metadata.annotations")
    reservation = node_reservation(node_annotations, cpus)
    system_qos = system_qos_resource(node_annotations)
    ls_pools, be_pools = cpu_share_pools(shared, pods)
    reserved_cpus = cpus_or_none(reservation.get("reservedCPUs", "")) or []
    ls_pools, be_pools = remove_cpus(ls_pools, reserved_cpus), remove_cpus(be_pools, reserved_cpus)
    if system_qos and system_qos.get("cpuset") and system_qos.get("cpusetExclusive", True):
        sys_cpus = cpus_or_none(system_qos["cpuset"]) or []
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
    node_labels = mapping_of(node_meta.get("labels"), "Node metadata.labels")
    if node_labels.get(LABEL_ENABLE_NUMA_RESERVATION):
        labels[LABEL_ENABLE_NUMA_RESERVATION] = node_labels[LABEL_ENABLE_NUMA_RESERVATION]
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
