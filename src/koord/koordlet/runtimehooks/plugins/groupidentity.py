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

from koord.apis.extension import LABEL_POD_QOS
from koord.hookapi import HookPoint

from ... import schedsysctl
from ...resources import KoordQoS, KubeQoS, Resources
from ..hooks import Hooks, InvalidInput, RuntimePlugin
from ..hostapps import HostApp
from ..protocol import PodContext
from ..rule import GroupIdentityRule, RuleError, Rules

log = logging.getLogger(__name__)

KERNEL_SWITCH = "sys/" + schedsysctl.GROUP_IDENTITY


class GroupIdentity(RuntimePlugin):
    name = "GroupIdentity"
    # The answer also depends on whether the node supports bvt, which kubelet's QoS dirs
    # settle before any pod runs, and, while no class is enabled, on the kernel switch, which
    # only an administrator flips then: a pod's refresh round picks that up.
    answers_from_request_and_rules = True

    _unsupported_logged = False
    _sysctl_error: str | None = None

    def register(self, hooks: Hooks) -> None:
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name,
                           "set pod cpu.bvt_warp_ns by QoS class", self.set_pod_bvt)

    def supported(self) -> bool:
        """Checked on each use (kubelet may create the QoS dirs after we start); logged once."""
        executor = self.env.executor
        qos_dir = executor.kube_qos_dir(KubeQoS.GUARANTEED)
        if executor.supports(qos_dir, "cpu_bvt_warp_ns") or (self.env.proc_root / KERNEL_SWITCH).exists():
            return True
        if not self._unsupported_logged:
            self._unsupported_logged = True
            log.info("plugin %s: neither %s nor %s exists; group identity is off on this node",
                     self.name, executor.path(qos_dir, "cpu_bvt_warp_ns"), self.env.proc_root / KERNEL_SWITCH)
        return False

    def update_rules(self, rules: Rules) -> bool:
        """Takes the rules; switches the kernel on at every NodeSLO that enables a class (someone
        may have switched it off since), as upstream's rule callback does."""
        changed = super().update_rules(rules)
        if rules.group_identity.enabled and self.supported():
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
        if message != self._sysctl_error:
            self._sysctl_error = message
            log.warning("plugin %s: %s", self.name, message)

    def _rule(self) -> GroupIdentityRule | None:
        """The rule to answer by; None when unsupported, without rules, or when no class is
        enabled and the kernel's switch is off (or unreadable)."""
        if self.rules is None or not self.supported():
            return None
        rule = self.rules.group_identity
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
