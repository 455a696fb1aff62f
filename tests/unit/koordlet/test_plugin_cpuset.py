"""CPUSetAllocator through Hooks: allocated cpusets, shared pools, kubelet static policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from koord.hookapi import FailurePolicy, HookPoint
from koord.koordlet.resourceexecutor.executor import CgroupExecutor
from koord.koordlet.resources import Resources
from koord.koordlet.runtimehooks.hooks import HookError, Hooks, PluginEnv
from koord.koordlet.runtimehooks.plugins.cpuset import CPUSetAllocator
from koord.koordlet.runtimehooks.protocol import (
    ContainerContext,
    ContainerRequest,
    PodContext,
    PodMeta,
    PodRequest,
)
from koord.koordlet.runtimehooks.rule import parse_rules

STATUS = "scheduling.koordinator.sh/resource-status"
POOLS = [{"socket": 0, "node": 0, "cpuset": "0-7"}, {"socket": 1, "node": 1, "cpuset": "8-15"}]
NO_FS = Path("/nonexistent")  # the plugin must not touch the file system
BE_POOLS = [{"socket": 0, "node": 0, "cpuset": "0-3"}, {"socket": 1, "node": 1, "cpuset": "8-11"}]


def node(policy: str = "none", pools: list | None = POOLS, be_pools: list | None = BE_POOLS) -> dict:
    annotations = {"kubelet.koordinator.sh/cpu-manager-policy": json.dumps({"policy": policy})}
    if pools is not None:
        annotations["node.koordinator.sh/cpu-shared-pools"] = json.dumps(pools)
    if be_pools is not None:
        annotations["node.koordinator.sh/be-cpu-shared-pools"] = json.dumps(be_pools)
    return {"metadata": {"annotations": annotations}}


def run(node_obj: dict | None, qos: str, annotations: dict | None = None,
        stage: HookPoint = HookPoint.PRE_CREATE_CONTAINER) -> ContainerContext:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(NO_FS, version=1), NO_FS, NO_FS))
    if node_obj is not None:
        plugin.update_rules(parse_rules(None, node_obj))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    labels = {"koordinator.sh/qosClass": qos} if qos else {}
    ctx = ContainerContext(ContainerRequest(
        pod_meta=PodMeta(name="p", namespace="ns", uid="1"), container_name="c1", container_id="cid",
        pod_labels=labels, pod_annotations=annotations or {}, pod_cgroup_parent="/kubepods/pod1"))
    hooks.run(stage, ctx)
    return ctx


@pytest.mark.parametrize("node_obj, qos, annotations, expected", [
    # allocated by the scheduler: exactly that cpuset, and no cfs quota whatever the class
    (node(), "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(), "LSE", {STATUS: '{"cpuset":"2,4"}'}, Resources(cpuset_cpus="2,4", cpu_quota=-1)),
    (None, "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(policy="static"), "LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpuset_cpus="0-3", cpu_quota=-1)),
    (node(), "LS", {STATUS: '{"cpuset":"5"}'}, Resources(cpuset_cpus="5", cpu_quota=-1)),
    # shared pools, joined
    (node(), "LS", {}, Resources(cpuset_cpus="0-15")),
    (node(), "", {}, Resources(cpuset_cpus="0-15")),
    (node(), "LSR", {STATUS: '{"numaNodeResources":[]}'}, Resources(cpuset_cpus="0-15")),
    (node(), "BE", {}, Resources(cpuset_cpus="0-3,8-11")),
    (node(pools=[{"socket": 0, "node": 0, "cpuset": "0-7"}]), "LS", {}, Resources(cpuset_cpus="0-7")),
    # kubelet static policy owns pods without a Koordinator class; LS/BE still get pools
    (node(policy="static"), "", {}, Resources()),
    (node(policy="static"), "LSR", {}, Resources()),
    (node(policy="static"), "LS", {}, Resources(cpuset_cpus="0-15")),
    (node(policy="static"), "BE", {}, Resources(cpuset_cpus="0-3,8-11")),
    # untouched: SYSTEM, no pools, no rules yet
    (node(), "SYSTEM", {}, Resources()),
    (node(pools=None), "LS", {}, Resources()),
    (node(be_pools=None), "BE", {}, Resources()),
    (None, "LS", {}, Resources()),
])
def test_container_cpuset(node_obj: dict | None, qos: str, annotations: dict, expected: Resources) -> None:
    assert run(node_obj, qos, annotations).response.resources == expected


def test_update_container_resources_too() -> None:
    ctx = run(node(), "LS", stage=HookPoint.PRE_UPDATE_CONTAINER_RESOURCES)
    assert ctx.response.resources.cpuset_cpus == "0-15"
    assert ctx.to_proto().container_resources.cpuset_cpus == "0-15"


@pytest.mark.parametrize("status, reason", [
    ("{not json", "bad JSON"),
    ('["0-3"]', "JSON object"),
    ('{"cpuset": 3}', "not a string"),
    ('{"cpuset": "3-1"}', "bad cpuset"),
])
def test_bad_resource_status(status: str, reason: str) -> None:
    with pytest.raises(HookError, match=reason) as info:
        run(node(), "LSR", {STATUS: status})
    assert STATUS in str(info.value)
    assert "ns/p container c1" in str(info.value)


@pytest.mark.parametrize("qos, annotations, expected", [
    # upstream's TestUnsetPodCPUQuota cases: a cpuset in resource-status unsets the pod's quota
    ("LS", {STATUS: '{"cpuset":"2-4"}'}, Resources(cpu_quota=-1)),
    ("LSR", {STATUS: '{"cpuset":"0-3"}'}, Resources(cpu_quota=-1)),
    ("LS", {STATUS: '{"numaNodeResources":[{"node":0}]}'}, Resources()),  # a share-pool allocation
    ("BE", {}, Resources()),
    ("", {}, Resources()),
])
def test_pod_cpu_quota_unset_for_cpuset_pods(qos: str, annotations: dict, expected: Resources) -> None:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(NO_FS, version=1), NO_FS, NO_FS))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=PodMeta(name="p", namespace="ns", uid="1"),
                                labels={"koordinator.sh/qosClass": qos} if qos else {},
                                annotations=annotations, cgroup_parent="/kubepods/pod1"))
    hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
    assert ctx.response.resources == expected


def test_pod_cpu_quota_bad_resource_status_is_an_error() -> None:
    plugin = CPUSetAllocator(PluginEnv(CgroupExecutor(NO_FS, version=1), NO_FS, NO_FS))
    hooks = Hooks(FailurePolicy.FAIL)
    plugin.register(hooks)
    ctx = PodContext(PodRequest(meta=PodMeta(name="p", namespace="ns", uid="1"),
                                annotations={STATUS: "bad-format"}, cgroup_parent="/kubepods/pod1"))
    with pytest.raises(HookError, match=STATUS):
        hooks.run(HookPoint.PRE_RUN_POD_SANDBOX, ctx)
