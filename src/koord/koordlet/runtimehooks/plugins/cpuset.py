"""CPUSetAllocator: pins containers to the cpus the scheduler or the node's pools grant.

Decisions (upstream koordlet's cpuset rule):

- a pod whose ``scheduling.koordinator.sh/resource-status`` carries a cpuset gets exactly
  that set, and loses its CFS quota (-1) at the container and at the pod level: cpus bound
  to it are its own, and kubelet's pod-level quota (set when it creates the pod cgroup, before
  any hook runs) would otherwise keep throttling the pod while its containers read ``max``;
- LS pods get every shared pool of the node, BE pods every BE shared pool;
- pods without a QoS label (and LSE/LSR pods not yet allocated) get the shared pools too,
  unless kubelet runs the static cpu manager policy: then kubelet owns their cpusets and
  they stay untouched. LS/BE pods are Koordinator's and get pools under either policy;
- SYSTEM pods stay untouched; so does any pod when the node has no matching pool, because
  an empty cpuset would mean "no cpus", not "all cpus".
"""

from __future__ import annotations

import logging

from koord.hookapi import HookPoint, cpuset_value, format_cpuset, json_annotation, parse_cpuset

from ...resources import KoordQoS
from ..hooks import Hooks, InvalidInput, RuntimePlugin
from ..protocol import ContainerContext, PodContext
from ..rule import CPUSharedPool

log = logging.getLogger(__name__)

RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


def resource_status_cpuset(annotations: dict[str, str]) -> str | None:
    """The cpuset the scheduler allocated to a pod, or None; InvalidInput when the annotation is bad."""
    status = json_annotation(annotations, RESOURCE_STATUS, error=InvalidInput)
    if status is None:
        return None
    cpuset = status.get("cpuset")
    if cpuset is None or cpuset == "":
        return None
    return cpuset_value(cpuset, f"pod annotation {RESOURCE_STATUS}: cpuset", InvalidInput)


def join_pools(pools: tuple[CPUSharedPool, ...]) -> str:
    cpus: set[int] = set()
    for pool in pools:
        cpus.update(parse_cpuset(pool.cpuset))
    return format_cpuset(cpus)


class CPUSetAllocator(RuntimePlugin):
    name = "CPUSetAllocator"
    answers_from_request_and_rules = True

    def register(self, hooks: Hooks) -> None:
        for stage in (HookPoint.PRE_CREATE_CONTAINER, HookPoint.PRE_UPDATE_CONTAINER_RESOURCES):
            hooks.register_container(stage, self.name, "set container cpuset by allocation and shared pools",
                                     self.set_container_cpuset)
        # The reconciler replays this stage for running pods, so a quota kubelet (re)writes is
        # cleared again within one interval.
        hooks.register_pod(HookPoint.PRE_RUN_POD_SANDBOX, self.name, "unset pod cpu quota of cpuset pods",
                           self.unset_pod_cpu_quota)

    def unset_pod_cpu_quota(self, ctx: PodContext) -> None:
        allocated = resource_status_cpuset(ctx.request.annotations)
        if allocated is not None:
            ctx.response.resources.cpu_quota = -1
            log.debug("plugin %s: pod %s: cpuset %s: pod cpu quota unset", self.name, ctx.request.meta, allocated)

    def set_container_cpuset(self, ctx: ContainerContext) -> None:
        req, res = ctx.request, ctx.response.resources
        who = f"pod {req.pod_meta} container {req.container_name}"
        qos = req.koord_qos
        allocated = resource_status_cpuset(req.pod_annotations)
        if allocated is not None:
            res.cpuset_cpus = allocated
            res.cpu_quota = -1
            log.debug("plugin %s: %s: allocated cpuset %s", self.name, who, allocated)
            return
        if self.rules is None:
            return
        if qos is KoordQoS.BE:
            pools = self.rules.be_cpu_shared_pools
        elif qos is KoordQoS.LS:
            pools = self.rules.cpu_shared_pools
        elif qos is KoordQoS.SYSTEM or self.rules.kubelet_cpu_manager_policy == "static":
            return
        else:
            pools = self.rules.cpu_shared_pools
        if pools:
            res.cpuset_cpus = join_pools(pools)
            log.debug("plugin %s: %s: shared pool cpuset %s", self.name, who, res.cpuset_cpus)
