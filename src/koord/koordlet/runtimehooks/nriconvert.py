"""NRI's pod and container messages as hook requests, and hook answers as NRI adjustments.

koordlet's plugins see the same ``PodRequest`` and ``ContainerRequest`` whether a call came
from koord-runtime-proxy, the reconciler or NRI; this module is the NRI side of that.
Every value that reaches a request passes the same checks as a proxy request
(``problems()``) before any plugin runs, and an answer goes back only with the fields NRI
can carry: what only koordlet can write (group identity's bvt, plugins' own files) is left to
koordlet's own cgroup writes.
"""

from __future__ import annotations

from koord.nri import api_pb2 as api

from ..resources import Resources
from .protocol import ContainerRequest, ContainerResponse, HookPodMeta, PodRequest

MAX_ENV = 4096
"""Environment entries read from one NRI container: a container spec with more is refused."""


class NriInputError(ValueError):
    """An NRI message koordlet cannot make a request of; the message names the field."""


def pod_meta(pod: api.PodSandbox) -> HookPodMeta:
    return HookPodMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid)


def resources_of(msg: api.LinuxResources) -> Resources:
    """The values NRI's LinuxResources sets (an unset optional stays None)."""
    res = Resources()
    if msg.HasField("cpu"):
        cpu = msg.cpu
        if cpu.HasField("shares"):
            res.cpu_shares = cpu.shares.value
        if cpu.HasField("quota"):
            res.cpu_quota = cpu.quota.value
        if cpu.HasField("period"):
            res.cpu_period = cpu.period.value
        res.cpuset_cpus = cpu.cpus or None
        res.cpuset_mems = cpu.mems or None
    if msg.HasField("memory"):
        if msg.memory.HasField("limit"):
            res.memory_limit = msg.memory.limit.value
        if msg.memory.HasField("swap"):
            res.memory_swap_limit = msg.memory.swap.value
    res.unified = dict(msg.unified)
    res.hugepage_limits = {h.page_size: h.limit for h in msg.hugepage_limits}
    return res


def pod_request(pod: api.PodSandbox) -> PodRequest:
    linux = pod.linux
    return PodRequest(
        meta=pod_meta(pod),
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=linux.cgroup_parent,
        resources=resources_of(linux.pod_resources),
        runtime_handler=pod.runtime_handler,
        overhead=resources_of(linux.pod_overhead),
    )


def _envs(container: api.Container) -> dict[str, str]:
    if len(container.env) > MAX_ENV:
        raise NriInputError(f"container.env: {len(container.env)} entries, more than {MAX_ENV}")
    envs = {}
    for entry in container.env:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise NriInputError(f"container.env: {entry[:80]!r} is not KEY=VALUE")
        envs[key] = value
    return envs


def container_request(pod: api.PodSandbox, container: api.Container,
                      resources: api.LinuxResources | None = None) -> ContainerRequest:
    """``resources``: the new resources of an UpdateContainer; by default the container's own."""
    own = resources_of(resources if resources is not None else container.linux.resources)
    if container.linux.HasField("oom_score_adj"):
        own.oom_score_adj = container.linux.oom_score_adj.value
    return ContainerRequest(
        pod_meta=pod_meta(pod),
        container_name=container.name,
        container_id=container.id,
        pod_labels=dict(pod.labels),
        pod_annotations=dict(pod.annotations),
        container_annotations=dict(container.annotations),
        pod_cgroup_parent=pod.linux.cgroup_parent,
        envs=_envs(container),
        resources=own,
        pod_resources=resources_of(pod.linux.pod_resources),
    )


def linux_resources(res: Resources) -> api.LinuxResources | None:
    """The part of ``res`` NRI carries; None when that part is empty."""
    msg = api.LinuxResources()
    if res.cpu_shares is not None:
        msg.cpu.shares.value = res.cpu_shares
    if res.cpu_quota is not None:
        msg.cpu.quota.value = res.cpu_quota
    if res.cpu_period is not None:
        msg.cpu.period.value = res.cpu_period
    if res.cpuset_cpus is not None:
        msg.cpu.cpus = res.cpuset_cpus
    if res.cpuset_mems is not None:
        msg.cpu.mems = res.cpuset_mems
    if res.memory_limit is not None:
        msg.memory.limit.value = res.memory_limit
    if res.memory_swap_limit is not None:
        msg.memory.swap.value = res.memory_swap_limit
    for key, value in sorted(res.unified.items()):
        msg.unified[key] = value
    for size, limit in sorted(res.hugepage_limits.items()):
        msg.hugepage_limits.add(page_size=size, limit=limit)
    return msg if msg.ByteSize() else None


def adjustment(response: ContainerResponse) -> api.ContainerAdjustment:
    """The container being created, as the plugins answered: envs, annotations, resources,
    oom_score_adj and the RDT class (a moved cgroup parent has no NRI form and is not
    carried)."""
    adj = api.ContainerAdjustment()
    for key, value in sorted(response.envs.items()):
        adj.env.add(key=key, value=value)
    for key, value in sorted(response.annotations.items()):
        adj.annotations[key] = value
    resources = linux_resources(response.resources)
    if resources is not None:
        adj.linux.resources.CopyFrom(resources)
    if response.resources.oom_score_adj is not None:
        adj.linux.oom_score_adj.value = response.resources.oom_score_adj
    if response.rdt_class:
        adj.linux.resources.rdt_class.value = response.rdt_class
    return adj


def update(container_id: str, response: ContainerResponse) -> api.ContainerUpdate | None:
    """The resources the plugins answered for a container that exists; None when there are none."""
    resources = linux_resources(response.resources)
    if resources is None:
        return None
    return api.ContainerUpdate(container_id=container_id, linux=api.LinuxContainerUpdate(resources=resources))
