"""CoreSched's rule: core scheduling per class from NodeSLO ``resourceQOSStrategy``
(upstream's coresched rule), each class on only under ``cpuPolicy: coreSched``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...resources import KubeQoS
from ..rule import Rule, RuleError, Source
from .cpuqos import BASE, CPU_POLICY_CORE_SCHED, class_cpu_qos, cpu_policy


@dataclass(frozen=True)
class CoreSchedParam:
    """One QoS class under the coreSched cpu policy (all False under any other policy)."""

    enable: bool = False
    expeller: bool = False
    cpu_idle: bool = False


@dataclass(frozen=True)
class CoreSchedRule:
    """Core scheduling of the LSR, LS and BE classes."""

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


def parse_core_sched(spec: dict[str, Any]) -> CoreSchedRule:
    """Per class: enable, coreExpeller and schedIdle == 1, each only under cpuPolicy coreSched."""
    on = cpu_policy(spec) == CPU_POLICY_CORE_SCHED
    params: dict[str, CoreSchedParam] = {}
    for key, attr in (("lsrClass", "lsr"), ("lsClass", "ls"), ("beClass", "be")):
        cpu_qos = class_cpu_qos(spec, key)
        path = f"{BASE}.{key}.cpuQOS"
        expeller = cpu_qos.get("coreExpeller")
        if not isinstance(expeller, bool):
            raise RuleError(f"{path}.coreExpeller={expeller!r:.40}: want true or false")
        idle = cpu_qos.get("schedIdle")
        if isinstance(idle, bool) or idle not in (0, 1):
            raise RuleError(f"{path}.schedIdle={idle!r:.40}: want 0 or 1")
        params[attr] = CoreSchedParam(enable=on and cpu_qos["enable"], expeller=on and expeller,
                                      cpu_idle=on and idle == 1)
    return CoreSchedRule(**params)


CORE_SCHED: Rule[CoreSchedRule | None] = Rule("coreSched", Source.NODE_SLO, parse_core_sched, absent=None)
"""None without a NodeSLO: nothing about core scheduling or cpu.idle is written then."""
