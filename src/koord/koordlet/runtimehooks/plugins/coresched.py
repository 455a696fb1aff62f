"""CoreSched: the CPU QoS of mainline kernels, NodeSLO ``cpuPolicy: coreSched``.

What this plugin does: ``cpu.idle`` of the kube-QoS dirs as upstream writes it, from each
class's ``schedIdle`` (``kubepods/besteffort`` 1 when BE's schedIdle is 1, ``burstable`` and
``kubepods`` from LS's / LSR's, 0 under any other policy, so turning the policy off undoes
it), through the reconciler's kube-QoS level. SCHED_IDLE groups yield the cpu to every
non-idle sibling at once, which is what protects LS pods from BE ones without group identity.

Core-scheduling cookies (``cookies.py``): when a class enables core scheduling, koordlet
probes the kernel once and says in one line whether it supports it; where it does, every
process of a new container (PostStartContainer) and of a running one (the reconciler's
rounds) gets its group's cookie, and processes of pods the rule no longer enables lose
theirs. SYSTEM pods and sandboxes are left alone. Where the kernel lacks it, nothing but
cpu.idle is done and pods start as usual.
"""

from __future__ import annotations

import logging

from koord.hookapi import HookPoint

from ...resourceexecutor.executor import CgroupError
from ..hooks import HookError, Hooks, PluginEnv, RuntimePlugin
from ..protocol import ContainerContext, KoordQoS, KubeQoS, Resources
from ..rule import Rules
from .cookies import CookieError, CookieManager, CookieOps, PrctlCookies, pod_group, supported

log = logging.getLogger(__name__)


class CoreSched(RuntimePlugin):
    name = "CoreSched"

    def __init__(self, env: PluginEnv, ops: CookieOps | None = None) -> None:
        super().__init__(env)
        self.ops: CookieOps = ops if ops is not None else PrctlCookies()
        self.cookies = CookieManager(self.ops)
        self.supported: bool | None = None
        """None until a rule enables core scheduling and the kernel was asked."""
        self._said: set[str] = set()

    def register(self, hooks: Hooks) -> None:
        """cpu.idle lives at the kube-QoS level, which the reconciler writes; cookies go to
        processes, which exist from PostStartContainer on (the reconciler replays
        PreCreateContainer for running containers)."""
        description = "core scheduling cookies of the container's processes"
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER):
            hooks.register_container(stage, self.name, description, self.set_container_cookie)

    def update_rules(self, rules: Rules) -> bool:
        changed = super().update_rules(rules)
        if changed and rules.core_sched is not None and rules.core_sched.enabled and self.supported is None:
            self.supported, why = supported(self.ops)
            if self.supported:
                log.info("plugin %s: the kernel supports core scheduling: cookies by group", self.name)
            else:
                log.warning("plugin %s: core scheduling is not supported by this kernel: %s; "
                            "cpu.idle is still applied, pods start as usual", self.name, why)
        return changed

    def set_container_cookie(self, ctx: ContainerContext) -> None:
        req = ctx.request
        rule = self.rules.core_sched if self.rules is not None else None
        if rule is None or not self.supported or not req.container_id or req.koord_qos is KoordQoS.SYSTEM:
            return
        enabled, group = pod_group(rule, req.pod_labels, req.kube_qos, req.pod_meta.uid)
        ex = self.env.executor
        try:
            text = ex.read(ex.container_dir(req.pod_cgroup_parent, req.container_id), "procs")
        except CgroupError:
            return  # not started yet, or gone
        pids = [int(p) for p in text.split() if p.isascii() and p.isdigit()]
        try:
            cookie = self.cookies.apply(enabled, group, pids)
        except CookieError as exc:
            raise HookError(f"core scheduling cookie for group {group!r}: {exc}") from None
        log.debug("plugin %s: pod %s container %s: group %r cookie %#x for %d processes", self.name,
                  req.pod_meta, req.container_name, group, cookie, len(pids))

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        if self.rules is None or self.rules.core_sched is None:
            return None
        qos_dir = self.env.executor.kube_qos_dir(qos)
        if not self.env.executor.supports(qos_dir, "cpu_idle"):
            if "no-file" not in self._said and self.env.executor.supports(qos_dir, "cpu_shares"):
                self._said.add("no-file")
                log.warning("plugin %s: this kernel has no cpu.idle (Linux 5.15+): not set", self.name)
            return None
        return Resources(cpu_idle=self.rules.core_sched.kube_qos_cpu_idle(qos))
