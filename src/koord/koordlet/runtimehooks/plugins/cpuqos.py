"""NodeSLO ``resourceQOSStrategy``'s CPU QoS as both CPU QoS plugins read it: the cpu policy
(``groupIdentity`` or ``coreSched``) and each class's checked ``cpuQOS`` section.

The spec is the merged one (``rule.Source.NODE_SLO``): every field has upstream's default.
"""

from __future__ import annotations

from typing import Any

from ..rule import RuleError, rule_object

CPU_POLICY_GROUP_IDENTITY = "groupIdentity"
CPU_POLICY_CORE_SCHED = "coreSched"
CPU_POLICIES = (CPU_POLICY_GROUP_IDENTITY, CPU_POLICY_CORE_SCHED)
BASE = "spec.resourceQOSStrategy"


def _strategy(spec: dict[str, Any]) -> dict[str, Any]:
    return rule_object(spec.get("resourceQOSStrategy"), "NodeSLO spec.resourceQOSStrategy")


def cpu_policy(spec: dict[str, Any]) -> str:
    """``policies.cpuPolicy``; RuleError for a policy upstream does not know."""
    policy = rule_object(_strategy(spec).get("policies"), f"{BASE}.policies").get("cpuPolicy")
    if policy not in CPU_POLICIES:
        raise RuleError(f"{BASE}.policies.cpuPolicy={policy!r}: want one of {CPU_POLICIES}")
    return str(policy)


def class_cpu_qos(spec: dict[str, Any], key: str) -> dict[str, Any]:
    """``<key>.cpuQOS`` (``lsrClass`` ...) with its ``enable`` checked."""
    klass = rule_object(_strategy(spec).get(key), f"{BASE}.{key}")
    path = f"{BASE}.{key}.cpuQOS"
    cpu_qos = rule_object(klass.get("cpuQOS"), path)
    enable = cpu_qos.get("enable")
    if not isinstance(enable, bool):
        raise RuleError(f"{path}.enable={enable!r} is not a boolean")
    return cpu_qos
