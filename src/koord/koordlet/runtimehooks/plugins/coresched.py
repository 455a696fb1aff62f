"""CoreSched: the CPU QoS of mainline kernels, NodeSLO ``cpuPolicy: coreSched``.

What this plugin does: ``cpu.idle`` of the kube-QoS dirs as upstream writes it, from each
class's ``schedIdle`` (``kubepods/besteffort`` 1 when BE's schedIdle is 1, ``burstable`` and
``kubepods`` from LS's / LSR's, 0 under any other policy, so turning the policy off undoes
it), through the reconciler's kube-QoS level. SCHED_IDLE groups yield the cpu to every
non-idle sibling at once, which is what protects LS pods from BE ones without group identity.

Kernel switches (``schedsysctl``): at every NodeSLO that enables core scheduling for a
class, a kernel with ``kernel.sched_group_identity_enabled`` gets it set to 0 (group
identity's bvt -1 and core scheduling exclude each other) and one with ``kernel.sched_core``
(Anolis) gets that set to 1, before any cookie is given, as upstream's initSystem does.

Core-scheduling cookies (``cookies.py``): when a class enables core scheduling, koordlet
probes the kernel once and says in one line whether it supports it; where it does, every
process of a new container (PostStartContainer) and of a running one (the reconciler's
rounds) gets its group's cookie, and processes of pods the rule no longer enables lose
theirs. SYSTEM pods and sandboxes are left alone. Where the kernel lacks it, nothing but
cpu.idle is done and pods start as usual.

Before the first cookie is given, the plugin learns which cookies the processes of the
running pods (the states informer's list, sandboxes included) already hold, as upstream's
cookie cache warm-up does: a restarted koordlet keeps each group's cookie instead of
creating a second one. Until a running container's processes could be asked, no cookie is
given (the reconciler's next round tries again). Metrics: ``coreschedmetrics.py``.
"""

from __future__ import annotations

import logging

from koord.hookapi import HookPoint
from koord.logonce import LogOnce

from ... import schedsysctl
from ...cgrouplayout import container_cgroup_dir, driver_of_cgroup_parent
from ...resourceexecutor.executor import CgroupError
from ...resources import CgroupFile
from ...statesinformer.meta import PodMeta
from ..hooks import HookError, Hooks, PluginEnv, RuntimePlugin
from ..protocol import ContainerContext, KoordQoS, KubeQoS, PodContext, Resources
from ..rule import Rules
from .cookies import CookieError, CookieManager, CookieOps, Holder, PrctlCookies, pod_group, supported
from .coreschedmetrics import CookieHolder, CoreSchedMetrics
from .coreschedrule import CORE_SCHED, CoreSchedRule

log = logging.getLogger(__name__)

CPU_IDLE = CgroupFile("cpu_idle", "cpu", "cpu.idle", "cpu.idle", 0, 1)
"""cpu.idle (v1 and v2, Linux 5.15+): 1 makes the cgroup SCHED_IDLE against its siblings."""


class CoreSched(RuntimePlugin):
    name = "CoreSched"
    rules_read = (CORE_SCHED,)
    cgroup_files = (CPU_IDLE,)

    def __init__(self, env: PluginEnv, ops: CookieOps | None = None) -> None:
        super().__init__(env)
        self.ops: CookieOps = ops if ops is not None else PrctlCookies()
        self.cookies = CookieManager(self.ops)
        self.metrics = CoreSchedMetrics(env.node, env.registry)
        self.supported: bool | None = None
        """None until a rule enables core scheduling and the kernel was asked."""
        self._said = LogOnce(log)

    def register(self, hooks: Hooks) -> None:
        """cpu.idle lives at the kube-QoS level, which the reconciler writes; cookies go to
        processes, which exist from PostStartContainer on (the reconciler replays
        PreCreateContainer for running containers)."""
        description = "core scheduling cookies of the container's processes"
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.POST_START_CONTAINER):
            hooks.register_container(stage, self.name, description, self.set_container_cookie)
        hooks.register_pod(HookPoint.POST_STOP_POD_SANDBOX, self.name, "forget the pod's cookie metrics",
                           self.forget_pod)

    def forget_pod(self, ctx: PodContext) -> None:
        self.metrics.forget_pod(ctx.request.meta.uid)

    def update_rules(self, rules: Rules) -> bool:
        changed = super().update_rules(rules)
        rule = rules[CORE_SCHED]
        if rule is not None and rule.enabled:
            self._switch_kernel()
        if changed and rule is not None and rule.enabled and self.supported is None:
            self.supported, why = supported(self.ops)
            if self.supported:
                log.info("plugin %s: the kernel supports core scheduling: cookies by group", self.name)
            else:
                log.warning("plugin %s: core scheduling is not supported by this kernel: %s; "
                            "cpu.idle is still applied, pods start as usual", self.name, why)
        return changed

    def _switch_kernel(self) -> None:
        """Group identity off, then core scheduling on, on the kernels that have the switches."""
        proc = self.env.proc_root
        try:
            if (schedsysctl.exists(proc, schedsysctl.GROUP_IDENTITY)
                    and schedsysctl.switch(proc, schedsysctl.GROUP_IDENTITY, False)):
                log.info("plugin %s: set kernel.sched_group_identity_enabled to 0: group identity "
                         "excludes core scheduling", self.name)
            if schedsysctl.exists(proc, schedsysctl.SCHED_CORE) and schedsysctl.switch(proc, schedsysctl.SCHED_CORE,
                                                                                       True):
                log.info("plugin %s: set kernel.sched_core to 1", self.name)
        except schedsysctl.SysctlError as exc:
            message = f"cannot switch core scheduling on: {exc}"
            self._said.say(("switch", message), f"plugin {self.name}: {message}")

    def set_container_cookie(self, ctx: ContainerContext) -> None:
        req = ctx.request
        rule = self.rules[CORE_SCHED] if self.rules is not None else None
        if rule is None or not self.supported or not req.container_id or req.koord_qos is KoordQoS.SYSTEM:
            return
        if not self._warm_up(rule):
            log.debug("plugin %s: pod %s container %s: no running container's processes known yet; "
                      "no cookie before the cookies held already are", self.name, req.pod_meta, req.container_name)
            return
        enabled, group = pod_group(rule, req.pod_labels, req.kube_qos, req.pod_meta.uid)
        try:
            cgroup_dir = self.env.executor.container_dir(req.pod_cgroup_parent, req.container_id)
        except CgroupError:
            return  # an id that names no cgroup: no processes to give a cookie to
        pids = self._procs(cgroup_dir)
        if pids is None:
            return  # not started yet, or gone
        holder = CookieHolder(req.pod_meta.namespace, req.pod_meta.name, req.pod_meta.uid, req.container_name,
                              req.container_id)
        try:
            cookie = self.cookies.apply(enabled, group, pids)
        except CookieError as exc:
            self.metrics.record_status(group, False)
            raise HookError(f"core scheduling cookie for group {group!r}: {exc}") from None
        if not enabled:
            self.metrics.reset_cookie(holder)
        elif cookie:
            self.metrics.record_cookie(holder, group, cookie)
            self.metrics.record_status(group, True)
        log.debug("plugin %s: pod %s container %s: group %r cookie %#x for %d processes", self.name,
                  req.pod_meta, req.container_name, group, cookie, len(pids))

    def _procs(self, cgroup_dir: str) -> list[int] | None:
        """The pids in the cgroup's ``cgroup.procs``; None when it cannot be read."""
        try:
            text = self.env.executor.read(cgroup_dir, "procs")
        except CgroupError:
            return None
        return [int(p) for p in text.split() if p.isascii() and p.isdigit()]

    def _warm_up(self, rule: CoreSchedRule) -> bool:
        """True once the cookies the running pods' processes hold are known (at once without
        a pods source: nothing to learn from)."""
        if self.cookies.warmed:
            return True
        if self.env.current_pods is None:
            self.cookies.warmed = True
            return True
        try:
            pods = self.env.current_pods()
        except Exception as exc:  # the pods source's bug: tried again at the next container
            log.warning("plugin %s: cannot list pods to learn their cookies: %r", self.name, exc)
            return False
        holders = [h for pod in pods if pod.running for h in self._holders(rule, pod)]
        adopted = self.cookies.warm_up(holders)
        for holder, cookie in adopted:
            self.metrics.record_cookie(holder.key, holder.group, cookie)
        if self.cookies.warmed:
            log.info("plugin %s: cookies held at start: %d groups from %d of %d running containers",
                     self.name, len({h.group for h, _ in adopted}), len(adopted), len(holders))
        return self.cookies.warmed

    def _holders(self, rule: CoreSchedRule, pod: PodMeta) -> list[Holder[CookieHolder]]:
        """The pod's sandbox and running containers with their processes, as warm-up reads them."""
        _, group = pod_group(rule, pod.labels, KubeQoS.of_cgroup_parent(pod.cgroup_dir), pod.uid)
        dirs: list[tuple[str, str, str]] = []
        if pod.sandbox_id and pod.cgroup_dir:
            driver = driver_of_cgroup_parent(pod.cgroup_dir)
            try:
                dirs.append(("", pod.sandbox_id, container_cgroup_dir(pod.cgroup_dir, pod.sandbox_id, driver)))
            except ValueError as exc:
                log.debug("plugin %s: pod %s: sandbox: %s", self.name, pod.key, exc)
        dirs.extend((c.name, c.id, c.cgroup_dir) for c in pod.containers if c.running and c.id and c.cgroup_dir)
        holders: list[Holder[CookieHolder]] = []
        for name, cid, cgroup_dir in dirs:
            pids = self._procs(cgroup_dir)
            if pids:
                holders.append(Holder(group, pids, CookieHolder(pod.namespace, pod.name, pod.uid, name, cid)))
        return holders

    def kube_qos_resources(self, qos: KubeQoS) -> Resources | None:
        rule = self.rules[CORE_SCHED] if self.rules is not None else None
        if rule is None:
            return None
        qos_dir = self.env.executor.kube_qos_dir(qos)
        if not self.env.executor.file_path(qos_dir, CPU_IDLE).is_file():
            if not self._said.holds("no-file") and self.env.executor.supports(qos_dir, "cpu_shares"):
                self._said.say("no-file", "plugin %s: this kernel has no cpu.idle (Linux 5.15+): not set", self.name)
            return None
        return Resources(files={CPU_IDLE: rule.kube_qos_cpu_idle(qos)})
