"""Koordinator's API as the node sees it: every label, annotation and extended-resource name
koordlet and the proxy read or write, each defined once here, and the parsers of the
annotations more than one module reads (a pod's resource status; a Node's reservation,
system-QoS resource and kubelet CPU manager policy).

The scheduler, koord-manager and the node agents talk through these keys; a key spelt twice
drifts. One error policy for the parsers: a malformed value raises ``AnnotationError``
naming the object, the annotation and the field; each caller decides what that means for it
(a hook refuses the request, a strategy skips the pod, a report leaves the field out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from koord.hookapi import cpuset_value, json_annotation, parse_quantity

# ---- pod labels ---------------------------------------------------------------------------
LABEL_POD_QOS = "koordinator.sh/qosClass"
LABEL_POD_PRIORITY = "koordinator.sh/priority"
LABEL_POD_PRIORITY_CLASS = "koordinator.sh/priority-class"
LABEL_POD_EVICTION_ENABLED = "koordinator.sh/eviction-enabled"
LABEL_CORE_SCHED_GROUP_ID = "koordinator.sh/core-sched-group-id"
LABEL_CORE_SCHED_POLICY = "koordinator.sh/core-sched-policy"
LABEL_ENABLE_NUMA_RESERVATION = "node.koordinator.sh/enable-numa-reservation"
"""On a Node: whether the scheduler reserves per NUMA node (koordlet manages it on the topology)."""
LABEL_RUNTIME_PROXY_SKIP = "runtimeproxy.koordinator.sh/skip-hookserver"
"""On a pod: the proxy calls no hooks for it (koordlet's own pod carries it)."""

# ---- pod annotations ----------------------------------------------------------------------
ANNOTATION_RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"
ANNOTATION_DEVICE_ALLOCATED = "scheduling.koordinator.sh/device-allocated"
ANNOTATION_EXTENDED_RESOURCE_SPEC = "node.koordinator.sh/extended-resource-spec"
ANNOTATION_RESCTRL = "node.koordinator.sh/resctrl"
ANNOTATION_POD_CPU_BURST = "koordinator.sh/cpuBurst"
ANNOTATION_POD_CPU_QOS = "koordinator.sh/cpuQOS"
ANNOTATION_POD_MEMORY_QOS = "koordinator.sh/memoryQOS"
ANNOTATION_EVICTION_POLICY = "koordinator.sh/eviction-policy"
ANNOTATION_EVICTION_PRIORITY = "koordinator.sh/eviction-priority"
ANNOTATION_OOM_SCORE_ADJ = "koordinator.sh/oom-score-adj"
ANNOTATION_OOM_SCORE_ADJ_SPEC = "koordinator.sh/oom-score-adj-spec"
ANNOTATION_CPU_NORMALIZATION_BASE_QUOTA = "koordlet.koordinator.sh/cpu-normalization-base-quota"

# ---- node annotations ---------------------------------------------------------------------
ANNOTATION_CPU_BASIC_INFO = "node.koordinator.sh/cpu-basic-info"
ANNOTATION_CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
ANNOTATION_CPU_SHARED_POOLS = "node.koordinator.sh/cpu-shared-pools"
ANNOTATION_BE_CPU_SHARED_POOLS = "node.koordinator.sh/be-cpu-shared-pools"
ANNOTATION_POD_CPU_ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
ANNOTATION_KUBELET_CPU_MANAGER_POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ANNOTATION_NODE_RESERVATION = "node.koordinator.sh/reservation"
ANNOTATION_SYSTEM_QOS_RESOURCE = "node.koordinator.sh/system-qos-resource"
ANNOTATION_CPU_NORMALIZATION_RATIO = "node.koordinator.sh/cpu-normalization-ratio"
ANNOTATION_RAW_ALLOCATABLE = "node.koordinator.sh/raw-allocatable"

# ---- extended resources -------------------------------------------------------------------
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_CPU = "kubernetes.io/mid-cpu"
MID_MEMORY = "kubernetes.io/mid-memory"


class AnnotationError(ValueError):
    """A Koordinator annotation that is not what its writer promises; the message names the
    object, the annotation and the field."""


@dataclass(frozen=True)
class ResourceStatus:
    """``scheduling.koordinator.sh/resource-status``: what the scheduler bound the pod to."""

    cpuset: str | None
    """The cpus (cpuset syntax) of an LSE/LSR pod, None when it has none."""
    numa_cpu_nodes: tuple[int, ...]
    """NUMA nodes granting the pod cpu or batch-cpu, in the annotation's order."""


NO_RESOURCE_STATUS = ResourceStatus(None, ())


def resource_status(annotations: Mapping[str, str], owner: str = "pod") -> ResourceStatus:
    """The pod's resource-status (empty when absent); AnnotationError naming the field."""
    status = json_annotation(annotations, ANNOTATION_RESOURCE_STATUS, error=AnnotationError, owner=owner)
    if status is None:
        return NO_RESOURCE_STATUS
    where = f"{owner} annotation {ANNOTATION_RESOURCE_STATUS}"
    cpuset = status.get("cpuset")
    allocated = None if cpuset is None or cpuset == "" else cpuset_value(cpuset, f"{where}: cpuset", AnnotationError)
    numa = status.get("numaNodeResources")
    if numa is None:
        return ResourceStatus(allocated, ())
    if not isinstance(numa, list):
        raise AnnotationError(f"{where}: numaNodeResources={numa!r:.60} is not a list")
    nodes: list[int] = []
    for i, item in enumerate(numa):
        at = f"{where}: numaNodeResources[{i}]"
        if not isinstance(item, dict):
            raise AnnotationError(f"{at}={item!r:.60} is not an object")
        node = item.get("node", 0)
        if isinstance(node, bool) or not isinstance(node, int) or node < 0:
            raise AnnotationError(f"{at}.node={node!r:.40}: want a non-negative integer")
        resources = item.get("resources")
        if resources is None:
            continue
        if not isinstance(resources, dict):
            raise AnnotationError(f"{at}.resources={resources!r:.60} is not an object")
        if _grants_cpu(resources, at):
            nodes.append(node)
    return ResourceStatus(allocated, tuple(nodes))


def _grants_cpu(resources: dict, where: str) -> bool:
    """A non-zero cpu, or a positive batch-cpu, in one NUMA node's resources."""
    try:
        cpu = parse_quantity(resources["cpu"]) if "cpu" in resources else 0
        batch = parse_quantity(resources[BATCH_CPU]) if BATCH_CPU in resources else 0
    except ValueError as exc:
        raise AnnotationError(f"{where}.resources: {exc}") from None
    return cpu != 0 or batch > 0


def _node_object(annotations: Mapping[str, str], key: str, owner: str) -> tuple[dict, str]:
    """The annotation's JSON object (``{}`` when absent or null) and the prefix its errors name."""
    value = json_annotation(annotations, key, error=AnnotationError, owner=owner)
    return ({} if value is None else value), f"{owner} annotation {key}"


def _text(value: object, where: str) -> str:
    """A string field as Go unmarshals it: absent or null is ``""``, anything else not a string an error."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AnnotationError(f"{where}={value!r:.40}: want a string")
    return value


@dataclass(frozen=True)
class NodeReservation:
    """``node.koordinator.sh/reservation``: what the Node keeps from pods. ``reserved_cpus``
    is kept as written: readers differ on a list that does not parse (upstream's topology
    report drops it, CPU suppress refuses it)."""

    resources: Mapping[str, str | int]
    """As written (every value a valid quantity), for the topology report to echo."""
    cpu: Fraction | None
    """``resources.cpu``, None when absent."""
    reserved_cpus: str
    apply_policy: str


def node_reservation(annotations: Mapping[str, str], owner: str = "node") -> NodeReservation:
    """The Node's reservation (empty when absent); AnnotationError naming the field."""
    raw, where = _node_object(annotations, ANNOTATION_NODE_RESERVATION, owner)
    resources = raw.get("resources")
    resources = {} if resources is None else resources
    if not isinstance(resources, dict):
        raise AnnotationError(f"{where}: resources={resources!r:.60} is not an object")
    quantities: dict[str, Fraction] = {}
    for name, value in resources.items():
        try:
            quantities[name] = parse_quantity(value)
        except ValueError as exc:
            raise AnnotationError(f"{where}: resources.{name}: {exc}") from None
    return NodeReservation(dict(resources), quantities.get("cpu"),
                           _text(raw.get("reservedCPUs"), f"{where}: reservedCPUs"),
                           _text(raw.get("applyPolicy"), f"{where}: applyPolicy"))


@dataclass(frozen=True)
class SystemQOSResource:
    """``node.koordinator.sh/system-qos-resource``: the cpus of QoS=SYSTEM pods. ``cpuset``
    is kept as written (the topology report echoes it; the cpuset rule and CPU suppress
    parse it and refuse a bad one)."""

    cpuset: str
    exclusive: bool | None
    """``cpusetExclusive``; None when absent, which upstream reads as true."""

    @property
    def is_exclusive(self) -> bool:
        return self.exclusive is None or self.exclusive


def system_qos_resource(annotations: Mapping[str, str], owner: str = "node") -> SystemQOSResource | None:
    """The Node's system-QoS resource, None when absent; AnnotationError naming the field."""
    raw = json_annotation(annotations, ANNOTATION_SYSTEM_QOS_RESOURCE, error=AnnotationError, owner=owner)
    if raw is None:
        return None
    where = f"{owner} annotation {ANNOTATION_SYSTEM_QOS_RESOURCE}"
    exclusive = raw.get("cpusetExclusive")
    if exclusive is not None and not isinstance(exclusive, bool):
        raise AnnotationError(f"{where}: cpusetExclusive={exclusive!r:.40} is not a boolean")
    return SystemQOSResource(_text(raw.get("cpuset"), f"{where}: cpuset"), exclusive)


@dataclass(frozen=True)
class KubeletCPUManagerPolicy:
    """``kubelet.koordinator.sh/cpu-manager-policy``: the kubelet's CPU manager as the
    topology report announced it (policy ``""`` when absent)."""

    policy: str
    options: Mapping[str, str]
    reserved_cpus: str


def kubelet_cpu_manager_policy(annotations: Mapping[str, str], owner: str = "node") -> KubeletCPUManagerPolicy:
    """The Node's kubelet CPU manager policy; AnnotationError naming the field."""
    raw, where = _node_object(annotations, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, owner)
    options = raw.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
        raise AnnotationError(f"{where}: options={options!r:.60}: want an object of strings")
    return KubeletCPUManagerPolicy(_text(raw.get("policy"), f"{where}: policy"), dict(options),
                                   _text(raw.get("reservedCPUs"), f"{where}: reservedCPUs"))
