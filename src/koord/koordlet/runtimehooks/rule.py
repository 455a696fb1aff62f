"""Rule: turns NodeSLO and the Node object into the immutable rules the plugins read.

Rules are frozen values, so a plugin compares old and new rules to learn whether existing
pods need a refresh (``RuntimePlugin.update_rules``), and a half-parsed NodeSLO can never
leak into a plugin: ``parse_rules`` either returns complete rules or raises RuleError
naming the field that was wrong.

Defaults follow upstream koordinator's merged NodeSLO: group identity
LSR 2, LS 2, BE -1, SYSTEM 0, all classes disabled until NodeSLO enables them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from koord.apis.extension import (
    ANNOTATION_BE_CPU_SHARED_POOLS,
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_KUBELET_CPU_MANAGER_POLICY,
    ANNOTATION_POD_CPU_QOS,
    ANNOTATION_SYSTEM_QOS_RESOURCE,
)
from koord.hookapi import cpuset_value, json_annotation, json_object

from ..resources import KoordQoS, KubeQoS
from ..slo import CFS_QUOTA_POLICY, SLOError, threshold_config
from .hostapps import HostApp, HostAppError, parse_host_apps

CPU_MANAGER_POLICIES = ("none", "static")
CPU_POLICY_GROUP_IDENTITY = "groupIdentity"
CPU_POLICY_CORE_SCHED = "coreSched"
CPU_POLICIES = (CPU_POLICY_GROUP_IDENTITY, CPU_POLICY_CORE_SCHED)
NONE_BVT = 0
"""The kernel's neutral group identity: what a class gets while its cpuQOS is disabled."""


class RuleError(ValueError):
    """NodeSLO, Node or a pod annotation holds a value the rules cannot use; names the field."""


_object = partial(json_object, error=RuleError)


@dataclass(frozen=True)
class ClassCPUQoS:
    enable: bool
    group_identity: int

    @property
    def bvt(self) -> int:
        return self.group_identity if self.enable else NONE_BVT


@dataclass(frozen=True)
class GroupIdentityRule:
    """Group identity (``cpu.bvt_warp_ns``) per Koordinator QoS class."""

    lsr: ClassCPUQoS = ClassCPUQoS(False, 2)
    ls: ClassCPUQoS = ClassCPUQoS(False, 2)
    be: ClassCPUQoS = ClassCPUQoS(False, -1)
    system: ClassCPUQoS = ClassCPUQoS(False, 0)

    @property
    def enabled(self) -> bool:
        return self.lsr.enable or self.ls.enable or self.be.enable or self.system.enable

    def pod_bvt(self, qos: KoordQoS, annotations: dict[str, str]) -> int | None:
        """The pod cgroup's value; LS pods may override it with ``koordinator.sh/cpuQOS``.

        Disabled classes get 0 rather than None, so turning a class off in NodeSLO resets
        pods that were set while it was on. LSE has no class of its own in NodeSLO and
        shares LSR's; pods without a QoS label stay neutral (0).
        """
        if qos is KoordQoS.LS and ANNOTATION_POD_CPU_QOS in annotations:
            override = _pod_cpu_qos(annotations)
            if override is not None:
                return override
        return {
            KoordQoS.LSE: self.lsr.bvt,
            KoordQoS.LSR: self.lsr.bvt,
            KoordQoS.LS: self.ls.bvt,
            KoordQoS.BE: self.be.bvt,
            KoordQoS.SYSTEM: self.system.bvt,
        }.get(qos, NONE_BVT)

    def host_app_bvt(self, qos: KoordQoS) -> int:
        """A host application's value by its class, as upstream: SYSTEM and no class stay neutral."""
        return {KoordQoS.LSE: self.lsr.bvt, KoordQoS.LSR: self.lsr.bvt, KoordQoS.LS: self.ls.bvt,
                KoordQoS.BE: self.be.bvt}.get(qos, NONE_BVT)

    def kube_qos_bvt(self, kube_qos: KubeQoS) -> int | None:
        """The kube-QoS dir's value: guaranteed stays 0 (kernel requirement upstream notes)."""
        if kube_qos is KubeQoS.BURSTABLE:
            return self.ls.bvt
        if kube_qos is KubeQoS.BESTEFFORT:
            return self.be.bvt
        return NONE_BVT


def _pod_cpu_qos(annotations: dict[str, str]) -> int | None:
    """``{"enable":true,"groupIdentity":-1}`` -> -1; ``enable: false`` -> 0; no groupIdentity -> None."""
    where = f"pod annotation {ANNOTATION_POD_CPU_QOS}"
    value = json_annotation(annotations, ANNOTATION_POD_CPU_QOS, error=RuleError)
    enable = value.get("enable", True)
    if not isinstance(enable, bool):
        raise RuleError(f"{where}: enable={enable!r} is not a boolean")
    if not enable:
        return NONE_BVT
    if "groupIdentity" not in value:
        return None
    return _bvt(value["groupIdentity"], f"{where}: groupIdentity")


@dataclass(frozen=True)
class CoreSchedParam:
    """One QoS class under the coreSched cpu policy (all False under any other policy)."""

    enable: bool = False
    expeller: bool = False
    cpu_idle: bool = False


@dataclass(frozen=True)
class CoreSchedRule:
    """Core scheduling per class from NodeSLO ``resourceQOSStrategy`` (upstream's coresched rule)."""

    lsr: CoreSchedParam = CoreSchedParam()
    ls: CoreSchedParam = CoreSchedParam()
    be: CoreSchedParam = CoreSchedParam()

    @property
    def enabled(self) -> bool:
        return self.lsr.enable or self.ls.enable or self.be.enable

    def kube_qos_cpu_idle(self, kube_qos: KubeQoS) -> int:
        """``cpu.idle`` of a kube-QoS dir: besteffort follows BE's schedIdle, burstable LS's,
        the guaranteed (kubepods) dir LSR's when LSR is enabled, else LS's."""
        if kube_qos is KubeQoS.BESTEFFORT:
            param = self.be
        elif kube_qos is KubeQoS.BURSTABLE or not self.lsr.enable:
            param = self.ls
        else:
            param = self.lsr
        return 1 if param.cpu_idle else 0


# Upstream's defaults (DefaultCPUQOS): schedIdle 0; coreExpeller true for LSR and LS.
_CORE_SCHED_DEFAULTS = {"lsrClass": True, "lsClass": True, "beClass": False}


@dataclass(frozen=True)
class CPUSharedPool:
    socket: int
    node: int
    cpuset: str


@dataclass(frozen=True)
class Rules:
    group_identity: GroupIdentityRule = field(default_factory=GroupIdentityRule)
    cpu_shared_pools: tuple[CPUSharedPool, ...] = ()
    be_cpu_shared_pools: tuple[CPUSharedPool, ...] = ()
    kubelet_cpu_manager_policy: str = "none"
    system_qos_cpuset: str = ""
    """The cpuset of ``node.koordinator.sh/system-qos-resource``: SYSTEM pods' cpus ("" none)."""
    cpu_normalization_ratio: float | None = None
    batch_cfs_quota: bool = True
    """False while BE CPU suppress limits the besteffort dir by cfs quota: BE pods and
    containers then get quota -1 (see ``batch_cfs_quota_enabled``)."""
    core_sched: CoreSchedRule | None = None
    """None without a NodeSLO: nothing about core scheduling or cpu.idle is written then."""
    host_apps: tuple[HostApp, ...] = ()
    """NodeSLO's ``hostApplications``, for the reconciler."""


def parse_rules(node_slo: dict | None, node: dict | None, topology: dict | None = None) -> Rules:
    """NodeSLO (the object or its ``spec``), the Node and this node's NodeResourceTopology
    -> Rules, defaults merged in. The cpuset pools and the kubelet policy come from the
    topology koordlet computed (as upstream reads them), from the Node's annotations when
    there is none yet (a Node file written by hand)."""
    annotations = _node_annotations(node)
    pools_from = _node_annotations(topology) if topology is not None else annotations
    return Rules(
        group_identity=_group_identity(node_slo),
        batch_cfs_quota=batch_cfs_quota_enabled(node_slo),
        core_sched=_core_sched(node_slo),
        host_apps=_host_apps(node_slo),
        cpu_shared_pools=_shared_pools(pools_from, ANNOTATION_CPU_SHARED_POOLS),
        be_cpu_shared_pools=_shared_pools(pools_from, ANNOTATION_BE_CPU_SHARED_POOLS),
        kubelet_cpu_manager_policy=_cpu_manager_policy(pools_from),
        system_qos_cpuset=_system_qos_cpuset(pools_from),
        cpu_normalization_ratio=_normalization_ratio(annotations),
    )


_CLASSES = (("lsrClass", "lsr"), ("lsClass", "ls"), ("beClass", "be"), ("systemClass", "system"))


def _group_identity(node_slo: dict | None) -> GroupIdentityRule:
    default = GroupIdentityRule()
    if node_slo is None:
        return default
    spec = node_slo.get("spec", node_slo) if isinstance(node_slo, dict) else node_slo
    where = "NodeSLO spec"
    spec = _object(spec, where)
    strategy = _object(spec.get("resourceQOSStrategy"), f"{where}.resourceQOSStrategy")
    base = "spec.resourceQOSStrategy"
    policies = _object(strategy.get("policies"), f"{base}.policies")
    cpu_policy = policies.get("cpuPolicy", CPU_POLICY_GROUP_IDENTITY)
    if cpu_policy not in CPU_POLICIES:
        raise RuleError(f"{base}.policies.cpuPolicy={cpu_policy!r}: want one of {CPU_POLICIES}")
    values: dict[str, ClassCPUQoS] = {}
    for key, attr in _CLASSES:
        fallback: ClassCPUQoS = getattr(default, attr)
        path = f"{base}.{key}.cpuQOS"
        klass = _object(strategy.get(key), f"{base}.{key}")
        cpu_qos = _object(klass.get("cpuQOS"), path)
        enable = cpu_qos.get("enable", fallback.enable)
        if not isinstance(enable, bool):
            raise RuleError(f"{path}.enable={enable!r} is not a boolean")
        bvt = _bvt(cpu_qos.get("groupIdentity", fallback.group_identity), f"{path}.groupIdentity")
        # Core scheduling replaces group identity: the classes stay neutral then.
        values[attr] = ClassCPUQoS(enable and cpu_policy == CPU_POLICY_GROUP_IDENTITY, bvt)
    return GroupIdentityRule(**values)


def _core_sched(node_slo: dict | None) -> CoreSchedRule | None:
    """Per class: enable, coreExpeller and schedIdle == 1, each only under cpuPolicy coreSched.
    The NodeSLO's shape was checked by ``_group_identity`` already."""
    if node_slo is None:
        return None
    spec = node_slo.get("spec", node_slo)
    strategy = spec.get("resourceQOSStrategy") or {}
    policy = (strategy.get("policies") or {}).get("cpuPolicy", CPU_POLICY_GROUP_IDENTITY)
    base = "spec.resourceQOSStrategy"
    params: dict[str, CoreSchedParam] = {}
    for key, attr in (("lsrClass", "lsr"), ("lsClass", "ls"), ("beClass", "be")):
        cpu_qos = _object((strategy.get(key) or {}).get("cpuQOS"), f"{base}.{key}.cpuQOS")
        path = f"{base}.{key}.cpuQOS"
        expeller = cpu_qos.get("coreExpeller", _CORE_SCHED_DEFAULTS[key])
        if not isinstance(expeller, bool):
            raise RuleError(f"{path}.coreExpeller={expeller!r:.40}: want true or false")
        idle = cpu_qos.get("schedIdle", 0)
        if isinstance(idle, bool) or idle not in (0, 1):
            raise RuleError(f"{path}.schedIdle={idle!r:.40}: want 0 or 1")
        on = policy == CPU_POLICY_CORE_SCHED
        params[attr] = CoreSchedParam(enable=on and cpu_qos.get("enable") is True, expeller=on and expeller,
                                      cpu_idle=on and idle == 1)
    return CoreSchedRule(**params)


def _host_apps(node_slo: dict | None) -> tuple[HostApp, ...]:
    try:
        return parse_host_apps(node_slo)
    except HostAppError as exc:
        raise RuleError(str(exc)) from None


def batch_cfs_quota_enabled(node_slo: dict | None) -> bool:
    """Whether BE pods keep a cfs quota of their batch-cpu limit.

    Not while ``resourceUsedThresholdWithBE`` enables suppress with ``cpuSuppressPolicy:
    cfsQuota``: cgroup v1 refuses a parent's quota below a child's (EINVAL), so a BE pod's
    own quota would be the floor of the besteffort quota suppress writes. The pods are then
    held by their shares and the besteffort quota alone. The thresholds are validated as
    the QoS manager validates them, so both read one NodeSLO the same way.
    """
    if node_slo is None:
        return True
    obj = node_slo if "spec" in node_slo else {"spec": node_slo}
    try:
        config = threshold_config(obj)
    except SLOError as exc:
        raise RuleError(str(exc)) from None
    return config is None or not (config.enable and config.cpu_suppress_policy == CFS_QUOTA_POLICY)


def _bvt(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 2:
        raise RuleError(f"{where}={value!r}: want an integer in [-1, 2]")
    return value


def _node_annotations(node: dict | None) -> dict[str, str]:
    if node is None:
        return {}
    meta = _object(_object(node, "Node").get("metadata"), "Node metadata")
    annotations = _object(meta.get("annotations"), "Node metadata.annotations")
    return annotations


def _shared_pools(annotations: dict[str, str], key: str) -> tuple[CPUSharedPool, ...]:
    raw = json_annotation(annotations, key, want=list, error=RuleError, owner="node")
    if raw is None:
        return ()
    pools = []
    for i, item in enumerate(raw):
        where = f"node annotation {key}[{i}]"
        item = _object(item, where)
        socket, numa = item.get("socket", 0), item.get("node", 0)
        for name, number in (("socket", socket), ("node", numa)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise RuleError(f"{where}.{name}={number!r}: want a non-negative integer")
        cpuset = cpuset_value(item.get("cpuset"), f"{where}.cpuset", RuleError)
        pools.append(CPUSharedPool(socket=socket, node=numa, cpuset=cpuset))
    return tuple(pools)


def _cpu_manager_policy(annotations: dict[str, str]) -> str:
    raw = json_annotation(annotations, ANNOTATION_KUBELET_CPU_MANAGER_POLICY, error=RuleError, owner="node")
    if raw is None:
        return "none"
    policy = raw.get("policy") or "none"
    if policy not in CPU_MANAGER_POLICIES:
        raise RuleError(f"node annotation {ANNOTATION_KUBELET_CPU_MANAGER_POLICY}: policy={policy!r}: "
                        f"want one of {CPU_MANAGER_POLICIES}")
    return policy


def _system_qos_cpuset(annotations: dict[str, str]) -> str:
    raw = json_annotation(annotations, ANNOTATION_SYSTEM_QOS_RESOURCE, error=RuleError, owner="node")
    if raw is None or raw.get("cpuset") in (None, ""):
        return ""
    return cpuset_value(raw["cpuset"], f"node annotation {ANNOTATION_SYSTEM_QOS_RESOURCE}: cpuset", RuleError)


_RATIO = re.compile(r"[0-9]{1,10}(\.[0-9]{1,10})?")


def _normalization_ratio(annotations: dict[str, str]) -> float | None:
    text = annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO)
    if text is None or text == "":
        return None
    where = f"node annotation {ANNOTATION_CPU_NORMALIZATION_RATIO}"
    # float() also takes other scripts' digits and "1_2"; Go's ParseFloat, which wrote it, does not.
    if not isinstance(text, str) or not _RATIO.fullmatch(text):
        raise RuleError(f"{where}={text!r}: not a decimal number like 1.2")
    ratio = float(text)
    if not math.isfinite(ratio) or ratio < 1.0:
        # Below 1 would inflate quotas beyond what the scheduler granted.
        raise RuleError(f"{where}={text!r}: want a finite ratio >= 1.0")
    return ratio
