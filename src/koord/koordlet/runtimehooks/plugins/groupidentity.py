"""GroupIdentity: sets ``cpu.bvt_warp_ns`` of pods and kube-QoS dirs by Koordinator QoS class.

Group identity is an Alibaba Cloud Linux / Anolis kernel feature: latency-sensitive groups
preempt best-effort ones on a shared core. Elsewhere the file does not exist and the plugin
stays silent after saying so once.
"""

from __future__ import annotations

import logging

from koord.hookapi import HookPoint

from ...resources import KubeQoS, Resources
from ..hooks import Hooks, InvalidInput, RuntimePlugin
from ..protocol import PodContext
from ..rule import RuleError

log = logging.getLogger(__name__)

KERNEL_SWITCH = "sys/kernel/sched_group_identity_enabled"


class GroupIdentity(RuntimePlugin):
    name = "GroupIdentity"
    # The answer also depends on whether the node supports bvt, which kubelet's QoS dirs
    # settle before any pod runs.
    answers_from_request_and_rules = True

    _unsupported_logged = False

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

    def set_pod_bvt(self, ctx: PodContext) -> None:
        if self.rules is None or not self.supported():
            return
        req = ctx.request
        try:
            bvt = self.rules.group_identity.pod_bvt(req.koord_qos, req.annotations)
        except RuleError as exc:
            raise InvalidInput(str(exc)) from None
        if bvt is not None:
            ctx.response.resources.cpu_bvt_warp_ns = bvt
            log.debug("plugin %s: pod %s qos %r -> bvt %d", self.name, req.meta, req.koord_qos.value, bvt)

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        if self.rules is None or not self.supported():
            return None
        bvt = self.rules.group_identity.kube_qos_bvt(qos)
        return None if bvt is None else Resources(cpu_bvt_warp_ns=bvt)
