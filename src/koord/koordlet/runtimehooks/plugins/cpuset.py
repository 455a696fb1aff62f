"""CPUSetAllocator: pins containers to the cpus the scheduler or the node's pools grant.

Decisions (upstream koordlet's cpuset rule), first match wins:

1. a pod whose ``scheduling.koordinator.sh/resource-status`` carries a cpuset (LSE/LSR) gets
   exactly that set, and loses its CFS quota (-1) at the container and at the pod level
   unless ``--disable-unset-cpu-quota``: cpus bound to it are its own, and kubelet's
   pod-level quota would otherwise keep throttling the pod while its containers read ``max``;
2. a NUMA-aware pod (the status's ``numaNodeResources`` grant cpu or batch-cpu on some NUMA
   node) gets the share pools of exactly those NUMA nodes: the BE pools for a QoS=BE pod
   when the BECPUManager gate is on, the LS pools for any pod that is not QoS=BE;
3. a QoS=SYSTEM pod gets the node's ``node.koordinator.sh/system-qos-resource`` cpuset;
4. an LS pod gets every share pool;
5. a pod in the kube besteffort tier (QoS=BE included) gets the empty cpuset: it is left to
   BE CPU suppress, and the empty value clears a cpuset kubelet's static policy passed;
6. any other pod gets every share pool, unless kubelet runs the static cpu manager policy:
   kubelet owns its cpuset then and it stays untouched.

The sandbox (pause) container is decided like the pod's containers. Host applications of
NodeSLO (only QoS=LS ones) get every share pool.
"""

from __future__ import annotations

import logging

from koord.apis import extension
from koord.apis.extension import AnnotationError, ResourceStatus
from koord.hookapi import HookPoint

from ...resources import KoordQoS, KubeQoS, Resources
from ...slo import HostApp
from ..hooks import Hooks, InvalidInput, PluginEnv, RuntimePlugin
from ..protocol import ContainerContext, ContainerRequest, PodContext
from ..rule import Rules
from .cpusetmetrics import CPUSetMetrics
from .cpusetrule import CPUSET, CPUSetRule, CPUSharedPool

log = logging.getLogger(__name__)

BE_CPU_MANAGER = "BECPUManager"
PER_CPU_METRIC = "PerCPUMetric"


def resource_status(annotations: dict[str, str]) -> ResourceStatus:
    """The pod's resource-status; InvalidInput (the hook's refusal) naming the field when it
    is malformed."""
    try:
        return extension.resource_status(annotations)
    except AnnotationError as exc:
        raise InvalidInput(str(exc)) from None


def resource_status_cpuset(annotations: dict[str, str]) -> str | None:
    """The cpuset the scheduler allocated to a pod, or None; InvalidInput when the annotation is bad."""
    return resource_status(annotations).cpuset


def join_pools(pools: tuple[CPUSharedPool, ...]) -> str:
    """The pools' cpusets joined with commas, in order, as the rule hands them to the runtime."""
    return ",".join(pool.cpuset for pool in pools)


def numa_pools(pools: tuple[CPUSharedPool, ...], nodes: tuple[int, ...]) -> str:
    """The cpusets of the pools on ``nodes``, one per (node, pool) match, in the nodes' order."""
    return ",".join(pool.cpuset for node in nodes for pool in pools if pool.node == node)


def container_cpuset(rule: CPUSetRule, req: ContainerRequest, status: ResourceStatus,
                     be_cpu_manager: bool) -> str | None:
    """Rules 2-6 of the module's docstring: the cpuset, ``""`` to clear it, None to leave it."""
    qos = req.koord_qos
    if status.numa_cpu_nodes:
        if qos is KoordQoS.BE and be_cpu_manager:
            return numa_pools(rule.be_cpu_shared_pools, status.numa_cpu_nodes)
        if qos is not KoordQoS.BE:
            return numa_pools(rule.cpu_shared_pools, status.numa_cpu_nodes)
    if qos is KoordQoS.SYSTEM and rule.system_qos_cpuset:
        return rule.system_qos_cpuset
    if qos is KoordQoS.LS:
        return join_pools(rule.cpu_shared_pools)
    if req.kube_qos is KubeQoS.BESTEFFORT:
        return ""
    if rule.kubelet_cpu_manager_policy == "static":
        return None
    return join_pools(rule.cpu_shared_pools)


def host_app_cpuset(rule: CPUSetRule, name: str, qos: str) -> str:
    """A NodeSLO host application's cpuset: every share pool; ValueError unless it is LS."""
    if qos != KoordQoS.LS.value:
        raise ValueError(f"host application {name}: qos {qos!r}: only LS is supported")
    return join_pools(rule.cpu_shared_pools)


class CPUSetAllocator(RuntimePlugin):
    name = "CPUSetAllocator"
    answers_from_request_and_rules = True
    rules_read = (CPUSET,)

    def __init__(self, env: PluginEnv) -> None:
        super().__init__(env)
        self.disable_unset_cpu_quota = env.disable_unset_cpu_quota
        self.be_cpu_manager = env.gate(BE_CPU_MANAGER)
        self.metrics = CPUSetMetrics(env.node, env.registry, per_cpu=env.gate(PER_CPU_METRIC))

    def register(self, hooks: Hooks) -> None:
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            hooks.register_container(stage, self.name, "set container cpuset by allocation and shared pools",
                                     self.set_container_cpuset)
        # The reconciler replays this stage for running pods, so a quota kubelet (re)writes is
        # cleared again within one interval.
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "unset pod cpu quota of cpuset pods",
                           self.unset_pod_cpu_quota)

    def update_rules(self, rules: Rules) -> bool:
        rule = rules[CPUSET]
        self.metrics.record_pools(rule.cpu_shared_pools, rule.be_cpu_shared_pools)
        return super().update_rules(rules)

    def reconcile_sandbox(self, ctx: ContainerContext) -> None:
        self.set_container_cpuset(ctx)

    def host_app_resources(self, app: HostApp) -> Resources | None:
        """LS host applications get every share pool; upstream refuses any other class (an
        error each round), here they are left alone and said once at debug level."""
        if self.rules is None:
            return None
        try:
            cpuset = host_app_cpuset(self.rules[CPUSET], app.name, app.qos)
        except ValueError as exc:
            log.debug("plugin %s: %s; its cpuset is left alone", self.name, exc)
            return None
        return Resources(cpuset_cpus=cpuset) if cpuset else None

    def unset_pod_cpu_quota(self, ctx: PodContext) -> None:
        if self.disable_unset_cpu_quota:
            return
        allocated = resource_status_cpuset(ctx.request.annotations)
        if allocated is not None:
            ctx.response.resources.cpu_quota = -1
            log.debug("plugin %s: pod %s: cpuset %s: pod cpu quota unset", self.name, ctx.request.meta, allocated)

    def set_container_cpuset(self, ctx: ContainerContext) -> None:
        req, res = ctx.request, ctx.response.resources
        who = f"pod {req.pod_meta} container {req.container_name or '(sandbox)'}"
        status = resource_status(req.pod_annotations)
        if status.cpuset is not None:
            res.cpuset_cpus = status.cpuset
            if not self.disable_unset_cpu_quota:
                res.cpu_quota = -1
            log.debug("plugin %s: %s: allocated cpuset %s", self.name, who, status.cpuset)
            return
        if self.rules is None:
            return
        cpuset = container_cpuset(self.rules[CPUSET], req, status, self.be_cpu_manager)
        if cpuset is not None:
            res.cpuset_cpus = cpuset
            log.debug("plugin %s: %s: cpuset %r from the rule", self.name, who, cpuset)
