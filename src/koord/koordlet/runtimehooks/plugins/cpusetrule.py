"""CPUSetAllocator's rule: the node's cpu share pools, kubelet's cpu manager policy and the
SYSTEM QoS cpuset, from the annotations of the NodeResourceTopology koordlet computed."""

from __future__ import annotations

from dataclasses import dataclass

from koord.apis.extension import (
    ANNOTATION_BE_CPU_SHARED_POOLS,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
    AnnotationError,
    kubelet_cpu_manager_policy,
    system_qos_resource,
)
from koord.hookapi import cpuset_value, json_annotation

from ..rule import Rule, RuleError, Source, rule_object

CPU_MANAGER_POLICIES = ("none", "static")


@dataclass(frozen=True)
class CPUSharedPool:
    socket: int
    node: int
    cpuset: str


@dataclass(frozen=True)
class CPUSetRule:
    """Each field's default is its value while its annotation is absent."""

    cpu_shared_pools: tuple[CPUSharedPool, ...] = ()
    be_cpu_shared_pools: tuple[CPUSharedPool, ...] = ()
    kubelet_cpu_manager_policy: str = "none"
    system_qos_cpuset: str = ""
    """The cpuset of ``node.koordinator.sh/system-qos-resource``: SYSTEM pods' cpus ("" none)."""


def parse_cpuset_rule(annotations: dict[str, str]) -> CPUSetRule:
    return CPUSetRule(
        cpu_shared_pools=_shared_pools(annotations, ANNOTATION_CPU_SHARED_POOLS),
        be_cpu_shared_pools=_shared_pools(annotations, ANNOTATION_BE_CPU_SHARED_POOLS),
        kubelet_cpu_manager_policy=_cpu_manager_policy(annotations),
        system_qos_cpuset=_system_qos_cpuset(annotations),
    )


def _shared_pools(annotations: dict[str, str], key: str) -> tuple[CPUSharedPool, ...]:
    raw = json_annotation(annotations, key, want=list, error=RuleError, owner="node")
    if raw is None:
        return ()
    pools = []
    for i, item in enumerate(raw):
        where = f"node annotation {key}[{i}]"
        item = rule_object(item, where)
        socket, numa = item.get("socket", 0), item.get("node", 0)
        for name, number in (("socket", socket), ("node", numa)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise RuleError(f"{where}.{name}={number!r}: want a non-negative integer")
        cpuset = cpuset_value(item.get("cpuset"), f"{where}.cpuset", RuleError)
        pools.append(CPUSharedPool(socket=socket, node=numa, cpuset=cpuset))
    return tuple(pools)


def _cpu_manager_policy(annotations: dict[str, str]) -> str:
    try:
        policy = kubelet_cpu_manager_policy(annotations).policy or CPUSetRule.kubelet_cpu_manager_policy
    except AnnotationError as exc:
        raise RuleError(str(exc)) from None
    if policy not in CPU_MANAGER_POLICIES:
        raise RuleError(f"node annotation {ANNOTATION_KUBELET_CPU_MANAGER_POLICY}: policy={policy!r}: "
                        f"want one of {CPU_MANAGER_POLICIES}")
    return policy


def _system_qos_cpuset(annotations: dict[str, str]) -> str:
    try:
        system_qos = system_qos_resource(annotations)
    except AnnotationError as exc:
        raise RuleError(str(exc)) from None
    if system_qos is None or not system_qos.cpuset:
        return ""
    return cpuset_value(system_qos.cpuset, f"node annotation {ANNOTATION_SYSTEM_QOS_RESOURCE}: cpuset", RuleError)


CPUSET: Rule[CPUSetRule] = Rule("cpuset", Source.NODE_TOPOLOGY, parse_cpuset_rule, absent=CPUSetRule())
