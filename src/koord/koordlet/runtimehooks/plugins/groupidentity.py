"""GroupIdentity: sets ``cpu.bvt_warp_ns`` of pods and kube-QoS dirs by Koordinator QoS class.

Group identity is an Alibaba Cloud Linux / Anolis kernel feature: latency-sensitive groups
preempt best-effort ones on a shared core. Elsewhere the file does not exist and the plugin
stays silent after saying so once.

Kernels from Anolis 26.4 on also have ``kernel.sched_group_identity_enabled``, without which
the bvt values do nothing. Whenever rules that enable a class arrive, such a kernel gets
``kernel.sched_core`` set to 0 (core scheduling refuses a bvt of -1) and the switch set to 1,
before the reconciler or a hook writes any bvt. While no class is enabled and the switch is
0, no bvt is written at all (there is nothing to undo); older kernels without the switch
always take the values.

Host applications (NodeSLO ``hostApplications``) get their class's value in their cgroup
(``cpu.bvt_warp_ns`` of ``host-latency-sensitive/<name>``, ``host-best-effort/<name>`` or
their ``cgroupPath``) at each reconciler round, as upstream's host application reconciler;
an application whose cgroup does not exist is skipped.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from koord.apis.extension import ANNOTATION_POD_CPU_QOS, LABEL_POD_QOS
from koord.hookapi import HookPoint, json_annotation
from koord.logonce import LogOnce

from ... import schedsysctl
from ...resources import KoordQoS, KubeQoS, Resources
from ...slo import HostApp
from ..hooks import Hooks, InvalidInput, PluginEnv, RuntimePlugin
from ..protocol import PodContext
from ..rule import DEFAULT_SPEC, Rule, RuleError, Rules, Source
from .cpuqos import BASE, CPU_POLICY_GROUP_IDENTITY, class_cpu_qos, cpu_policy

log = logging.getLogger(__name__)

KERNEL_SWITCH = "sys/" + schedsysctl.GROUP_IDENTITY
NONE_BVT = 0
"""The kernel's neutral group identity: what a class gets while its cpuQOS is disabled."""


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

    lsr: ClassCPUQoS
    ls: ClassCPUQoS
    be: ClassCPUQoS
    system: ClassCPUQoS

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


def _bvt(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 2:
        raise RuleError(f"{where}={value!r}: want an integer in [-1, 2]")
    return value


_CLASSES = (("lsrClass", "lsr"), ("lsClass", "ls"), ("beClass", "be"), ("systemClass", "system"))


def parse_group_identity(spec: dict[str, Any]) -> GroupIdentityRule:
    """Each class's enable and groupIdentity; core scheduling replaces group identity, so
    under ``cpuPolicy: coreSched`` every class stays neutral."""
    on = cpu_policy(spec) == CPU_POLICY_GROUP_IDENTITY
    values: dict[str, ClassCPUQoS] = {}
    for key, attr in _CLASSES:
        cpu_qos = class_cpu_qos(spec, key)
        bvt = _bvt(cpu_qos.get("groupIdentity"), f"{BASE}.{key}.cpuQOS.groupIdentity")
        values[attr] = ClassCPUQoS(cpu_qos["enable"] and on, bvt)
    return GroupIdentityRule(**values)


GROUP_IDENTITY = Rule("groupIdentity", Source.NODE_SLO, parse_group_identity,
                      absent=parse_group_identity(DEFAULT_SPEC))
"""Without a NodeSLO: upstream's defaults, every class disabled."""


class GroupIdentity(RuntimePlugin):
    name = "GroupIdentity"
    # The answer also depends on whether the node supports bvt, which kubelet's QoS dirs
    # settle before any pod runs, and, while no class is enabled, on the kernel switch, which
    # only an administrator flips then: a pod's refresh round picks that up.
    answers_from_request_and_rules = True
    rules_read = (GROUP_IDENTITY,)

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        self._said = LogOnce(log)

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name,
                           "set pod cpu.bvt_warp_ns by QoS class", self.set_pod_bvt)

    def supported(self) -> bool:
        """Checked on each use (kubelet may create the QoS dirs after we start); logged once."""
        executor = self.env.executor
        qos_dir = executor.kube_qos_dir(KubeQoS.GUARANTEED)
        if executor.supports(qos_dir, "cpu_bvt_warp_ns") or (self.env.proc_root / KERNEL_SWITCH).exists():
            return True
        self._said.say("unsupported", "plugin %s: neither %s nor %s exists; group identity is off on this node",
                       self.name, executor.path(qos_dir, "cpu_bvt_warp_ns"), self.env.proc_root / KERNEL_SWITCH,
                       level=logging.INFO)
        return False

    def update_rules(self, rules: Rules) -> bool:
        """Takes the rules; switches the kernel on at every NodeSLO that enables a class (someone
        may have switched it off since), as upstream's rule callback does."""
        changed = super().update_rules(rules)
        if rules[GROUP_IDENTITY].enabled and self.supported():
            self._switch_kernel_on()
        return changed

    def _switch_kernel_on(self) -> None:
        proc = self.env.proc_root
        if not schedsysctl.exists(proc, schedsysctl.GROUP_IDENTITY):
            return  # a kernel whose bvt works without a switch
        try:
            if (schedsysctl.exists(proc, schedsysctl.SCHED_CORE)
                    and schedsysctl.switch(proc, schedsysctl.SCHED_CORE, False)):
                log.info("plugin %s: set kernel.sched_core to 0: core scheduling refuses a bvt of -1", self.name)
            if schedsysctl.switch(proc, schedsysctl.GROUP_IDENTITY, True):
                log.info("plugin %s: set kernel.sched_group_identity_enabled to 1", self.name)
        except schedsysctl.SysctlError as exc:
            self._say_sysctl_error(f"cannot switch group identity on: {exc}")

    def _say_sysctl_error(self, message: str) -> None:
        self._said.say("sysctl", f"plugin {self.name}: {message}")

    def _rule(self) -> GroupIdentityRule | None:
        """The rule to answer by; None when unsupported, without rules, or when no class is
        enabled and the kernel's switch is off (or unreadable)."""
        if self.rules is None or not self.supported():
            return None
        rule = self.rules[GROUP_IDENTITY]
        proc = self.env.proc_root
        if rule.enabled or not schedsysctl.exists(proc, schedsysctl.GROUP_IDENTITY):
            return rule
        try:
            return rule if schedsysctl.enabled(proc, schedsysctl.GROUP_IDENTITY) else None
        except schedsysctl.SysctlError as exc:
            self._say_sysctl_error(f"cannot read the group identity switch: {exc}")
            return None

    def set_pod_bvt(self, ctx: PodContext) -> None:
        rule = self._rule()
        if rule is None:
            return
        req = ctx.request
        try:
            bvt = rule.pod_bvt(req.koord_qos, req.annotations)
        except RuleError as exc:
            raise InvalidInput(str(exc)) from None
        if bvt is not None:
            ctx.response.resources.cpu_bvt_warp_ns = bvt
            log.debug("plugin %s: pod %s qos %r -> bvt %d", self.name, req.meta, req.koord_qos.value, bvt)

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        rule = self._rule()
        if rule is None:
            return None
        bvt = rule.kube_qos_bvt(qos)
        return None if bvt is None else Resources(cpu_bvt_warp_ns=bvt)

    def host_app_resources(self, app: HostApp) -> Resources | None:
        """A host application's bvt by its class (an unknown class counts as none, SYSTEM and no
        class stay neutral, as upstream); the reconciler writes it where its cgroup exists."""
        rule = self._rule()
        if rule is None:
            return None
        return Resources(cpu_bvt_warp_ns=rule.host_app_bvt(KoordQoS.of({LABEL_POD_QOS: app.qos})))
